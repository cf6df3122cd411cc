"""Cached re-run vs first run: `python -m evalkit run` on a config twice, against a fresh result cache.

    python benchmarks/bench_cache.py                      # the embedded default config (~10 min first run)
    python benchmarks/bench_cache.py --config my.yaml     # any config
    python benchmarks/bench_cache.py --reduced            # the default's two llama.cpp deployments, small suites
    python benchmarks/bench_cache.py --gemma              # issue 23's config: Gemma 3 270M on llama.cpp and vLLM,
                                                          # prompts and cost (benchmarks/cache_gemma.yaml)

The result cache is a fresh temporary EVALKIT_CACHE_DIR, so the first run does all engine work; prepared
model variants are linked in from the usual cache dir (preparing them is not what is measured). Prints
each run's wall time, the ratio, and each deployment's cache hits/misses and whether its engine loaded
(from the run directory's engines/*.json). Target: the re-run >= 50x faster.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GEMMA_CONFIG = REPO / "benchmarks" / "cache_gemma.yaml"


def user_cache_dir() -> Path:
    env = os.environ.get("EVALKIT_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir as ucd

    return Path(ucd("evalkit"))


def reduced_config(path: Path) -> Path:
    """The default config's llama.cpp deployments with small suites (paths made absolute)."""
    cfg = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    cfg["deployments"] = [d for d in cfg["deployments"] if d["engine"] == "llamacpp"]
    cfg["reference"] = cfg["deployments"][0]["name"]
    cfg["suites"] = {
        "prompts": {"path": str(REPO / "prompts"), "categories": ["reasoning", "qa"], "limit_per_category": 2},
        "perplexity": {"text": str(REPO / "texts" / "ppl_default.txt"), "n_ctx": 256, "max_chunks": 2, "top_k": 10},
        "mmlu": {"source": "builtin", "per_subject": 2, "shots": 2, "seed": 0},
        "cost": {"concurrency": [1, 2], "prompt_tokens": 64, "output_tokens": 16, "repeats": 1},
    }
    cfg["sampling"]["max_tokens"] = 32
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_once(config: Path | None, out: Path, env: dict[str, str], console: Path | None = None) -> tuple[float, Path]:
    before = set(out.iterdir()) if out.exists() else set()
    cmd = [sys.executable, "-m", "evalkit", "run", "--out", str(out)] + (["--config", str(config)] if config else [])
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if console is not None:
        console.write_text(proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"evalkit run failed (exit {proc.returncode})")
    (run_dir,) = [p for p in set(out.iterdir()) - before if p.is_dir()]
    return wall, run_dir


def engine_stats(run_dir: Path) -> dict[str, dict[str, object]]:
    out = {}
    for f in sorted((run_dir / "engines").glob("*.json")):
        d = json.loads(f.read_text())
        out[f.stem] = {k: d.get(k) for k in ("cache_hits", "cache_misses", "engine_loaded")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, help="config to run (default: the embedded default)")
    ap.add_argument("--reduced", action="store_true", help="the default's llama.cpp deployments with small suites")
    ap.add_argument("--gemma", action="store_true", help=f"the issue-23 config ({GEMMA_CONFIG.relative_to(REPO)})")
    ap.add_argument("--keep", type=Path, help="work in this (new) directory and keep it: both run directories, "
                    "their terminal output (<label>.console.log) and the result cache")
    args = ap.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True)
    with (contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="evalkit-bench-cache-")) as tmp:
        tmp_path = Path(tmp)
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
        cache = tmp_path / "cache"
        cache.mkdir()
        variants = user_cache_dir() / "variants"
        if variants.is_dir():
            (cache / "variants").symlink_to(variants, target_is_directory=True)
        config = reduced_config(tmp_path / "reduced.yaml") if args.reduced else GEMMA_CONFIG if args.gemma else args.config
        env = {**os.environ, "EVALKIT_CACHE_DIR": str(cache)}
        out = tmp_path / "runs"
        out.mkdir()
        walls, stats = [], []
        for label in ("first run", "cached re-run"):
            print(f"{label} ...", file=sys.stderr, flush=True)
            wall, run_dir = run_once(config, out, env, tmp_path / f"{label.replace(' ', '-')}.console.log")
            walls.append(wall)
            stats.append(engine_stats(run_dir))
            print(f"{label}: {wall:.1f} s", flush=True)
        print(f"config: {config or 'embedded default'}")
        print(f"first run      {walls[0]:8.1f} s")
        print(f"cached re-run  {walls[1]:8.1f} s")
        print(f"speed-up       {walls[0] / walls[1]:8.1f}x (target >= 50x)")
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{'deployment':<22} {'run':<14} {'hits':>7} {'misses':>7}  engine loaded")
        for label, st in zip(("first", "re-run"), stats):
            for dep, s in st.items():
                print(f"{dep:<22} {label:<14} {s['cache_hits']!s:>7} {s['cache_misses']!s:>7}  {s['engine_loaded']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
