"""`evalkit diff` on two 20,000-item runs: the wall time of the command as a user runs it (a new Python process:
imports, reading both runs' records, the suites' paired statistics, the table), and the same call in-process.

Run A is bench_viewer's generated run (prompt-suite records, qa and reasoning items with gold answers, scored by
evalkit); run B is a copy of it a day later in which one deployment's answers changed on a share of the items
(re-scored by evalkit), so the diff has flips to count and intervals to compute.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_diff.py [--items 20000] [--deployments 2] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def make_runs(out: Path, n_items: int, n_deps: int, changed_share: float = 0.1) -> tuple[Path, Path]:
    from bench_viewer import generate

    from evalkit.scoring import score_run
    from evalkit.store import RunDir

    a = generate(out, n_items, n_deps)
    b = a.parent / "20991232-000000"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns(".evalkit*"))
    m = json.loads((b / "manifest.json").read_text())
    m["run_id"], m["created"] = b.name, "2100-01-01T00:00:00+00:00"
    (b / "manifest.json").write_text(json.dumps(m))
    dep = m["deployment_order"][-1]
    rng = random.Random(1)
    path = b / "records" / f"{dep}.jsonl"
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if rng.random() < changed_share:
            out = r["generation"] if "generation" in r else r  # records v3 keep the output in `generation`
            out["output_text"] = "I do not know."
            out["output_token_ids"] = [1, 2, 3, 4]
        lines.append(json.dumps(r, ensure_ascii=False, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    score_run(RunDir.open(b))
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--deployments", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="generate here and keep the runs")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-diff-"))
    base.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    a, b = make_runs(base, args.items, args.deployments)
    print(f"generated and scored two runs of {args.items} items x {args.deployments} deployments in {time.perf_counter() - t:.1f} s")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    import resource

    walls, cpus = [], []
    for _ in range(3):
        t = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "evalkit", "diff", str(a), str(b), "--margin", "prompts/qa/contains=-0.05"],
                              capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU seconds: what the figure is on a machine others load
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode not in (0, 1):
            print(proc.stderr)
            raise SystemExit(proc.returncode)
    print(proc.stdout)
    print(f"evalkit diff (new process, exit {proc.returncode}): wall " + ", ".join(f"{w:.2f} s" for w in walls)
          + f"; best {min(walls):.2f} s; CPU " + ", ".join(f"{c:.2f} s" for c in cpus) + f" (load average {os.getloadavg()[0]:.1f})")
    from evalkit.diff import diff_runs

    t = time.perf_counter()
    diff_runs(a, b, {"prompts/qa/contains": -0.05})
    print(f"diff_runs in-process (imports done): {time.perf_counter() - t:.2f} s")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
