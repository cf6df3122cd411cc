"""Under CI=true a test suite whose engine cannot import must fail, not turn green by skipping.

Shown on the real vLLM tests: pytest runs in a subprocess where `import vllm` raises (a package of that name
first on PYTHONPATH, as a broken install would), once with CI=true and once without.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = "tests/test_vllm_engine.py::test_info_describes_the_loaded_model"


def _pytest_without_vllm(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    shim = tmp_path / "shim" / "vllm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("vllm hidden by test_ci_policy (a broken install)")\n')
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shim"), str(REPO), env.get("PYTHONPATH", "")])
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TARGET],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_hidden_vllm_fails_under_ci(tmp_path: Path) -> None:
    proc = _pytest_without_vllm(tmp_path, ci=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]  # 1: tests failed (not 5: nothing collected, not 0: all skipped)
    assert "vllm hidden by test_ci_policy" in out and "CI=true" in out and "1 error" in out


def test_hidden_vllm_skips_with_a_reason_outside_ci(tmp_path: Path) -> None:
    proc = _pytest_without_vllm(tmp_path, ci=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 skipped" in out, out[-3000:]
