"""Where `make test`'s time goes: each test's wall time and CPU time, its own and its reaped children's.

    # a pytest plugin: one JSON line per test, per xdist worker, into $PYTEST_CPU_OUT (default /tmp/pytest-cpu)
    PYTHONPATH=benchmarks .venv/bin/python -m pytest -q -m "not vllm and not gpu" -n 2 --dist loadgroup -p pytest_cpu
    # then the table: test files by CPU time, and each worker's sums
    python benchmarks/pytest_cpu.py [DIR]

CPU time is the test process's (in-process engines) plus the children it waited for during the test (`evalkit
run`, its workers, llama-server): a module-scoped server's CPU is counted where it is stopped, at the module's
last test. Wall well above CPU on a worker pinned to one core (tests/conftest.py) is a core left idle; CPU well
above wall is work spread beyond that core, slowing the other worker.
"""
from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OUT = Path(os.environ.get("PYTEST_CPU_OUT", "/tmp/pytest-cpu"))


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started, (own, children) = time.monotonic(), _cpu()
    yield
    own_after, children_after = _cpu()
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"id": item.nodeid, "wall": time.monotonic() - started, "own": own_after - own,
                            "children": children_after - children}) + "\n")


def main(directory: Path) -> None:
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    workers: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row: dict[str, Any] = json.loads(line)
            cpu = row["own"] + row["children"]
            f = files[row["id"].split("::")[0]]
            f[0] += row["wall"]
            f[1] += cpu
            f[2] += 1
            workers[path.stem][0] += row["wall"]
            workers[path.stem][1] += cpu
    print(f"{'test file':<48} {'tests':>5} {'wall s':>8} {'CPU s':>8}")
    for name, (wall, cpu, n) in sorted(files.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"{name:<48} {int(n):>5} {wall:>8.1f} {cpu:>8.1f}")
    for worker, (wall, cpu) in sorted(workers.items()):
        print(f"worker {worker}: wall {wall:.0f} s, CPU {cpu:.0f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
