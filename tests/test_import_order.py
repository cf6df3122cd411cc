"""Every evalkit module can be the first one a process imports.

The static layering test (test_layers.py) sees import statements; it cannot see an import cycle that only
closes at run time, through the suite registry (a module-level `__getattr__` that loads every suite's spec, which
imports suite modules, which import the module being initialized). `python -c "import evalkit.suites.base"` hit
exactly that. Here each module is imported first in a fresh process: one interpreter preloads the third-party
packages evalkit imports (they never import evalkit, so they cannot take part in its cycles), then forks one
child per module, which imports only that module, so each child pays only for evalkit's own imports.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP = {"evalkit.__main__"}  # runs the command line when imported

# Step 1: which third-party top-level packages evalkit's modules import (learned in a throwaway process).
LEARN = r"""
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass  # step 2 reports it
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules if not m.startswith("evalkit") and m != "__main__"})))
"""

# Step 2: preload them, then one forked child per evalkit module.
CHECK = r"""
import importlib, json, os, sys, traceback
names, preload = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for top in preload:
    try:
        importlib.import_module(top)
    except Exception:
        pass
assert not [m for m in sys.modules if m.startswith("evalkit")], "a preloaded package imported evalkit"
failed = {}
running = {}  # pid -> (module, read end of its pipe)


def reap():
    pid, status = os.wait()
    name, r = running.pop(pid)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    if status:
        failed[name] = err or f"exit status {status}"


for name in names:
    if len(running) >= max(2, os.cpu_count() or 2):
        reap()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(w)
    running[pid] = (name, r)
while running:
    reap()
print(json.dumps(failed))
"""


def _modules() -> list[str]:
    out = []
    for path in sorted((REPO / "evalkit").rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name not in SKIP:
            out.append(name)
    return out


@pytest.mark.skipif(sys.platform == "win32", reason="uses fork")
def test_every_module_imports_first_in_a_fresh_process() -> None:
    names = _modules()
    assert len(names) > 100 and "evalkit.suites.base" in names
    learn = subprocess.run([sys.executable, "-c", LEARN, json.dumps(names)], capture_output=True, text=True, cwd=REPO,
                           timeout=300)
    assert learn.returncode == 0, learn.stderr
    preload = json.loads(learn.stdout.strip().splitlines()[-1])
    check = subprocess.run([sys.executable, "-c", CHECK, json.dumps(names), json.dumps(preload)], capture_output=True,
                           text=True, cwd=REPO, timeout=600)
    assert check.returncode == 0, check.stderr
    failed = json.loads(check.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"import {n} as the first import failed:\n{e}" for n, e in failed.items())


def test_the_check_catches_a_registry_cycle(tmp_path: Path) -> None:
    """The planted violation: a module-level __getattr__ that loads the registry for the import system's
    `__path__` probe (what evalkit.config did) makes `import evalkit.suites.base` fail first in a process."""
    planted = tmp_path / "planted"
    src = (REPO / "evalkit" / "config.py").read_text(encoding="utf-8")
    guard = '    if name.startswith("__"):'
    assert guard in src
    import shutil

    shutil.copytree(REPO / "evalkit", planted / "evalkit", ignore=shutil.ignore_patterns("__pycache__"))
    (planted / "evalkit" / "config.py").write_text(src.replace(guard, "    if False:"), encoding="utf-8")
    res = subprocess.run([sys.executable, "-c", CHECK, json.dumps(["evalkit.suites.base"]), "[]"], capture_output=True,
                         text=True, cwd=planted, timeout=300, env={"PYTHONPATH": str(planted), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    failed = json.loads(res.stdout.strip().splitlines()[-1])
    assert "circular import" in failed.get("evalkit.suites.base", ""), failed
