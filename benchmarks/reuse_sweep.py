"""Which prefix-reuse points give exactly a fresh pass's logits in llama.cpp (issue 30; evalkit's
`LlamaCppEngine._prefill` reuses at the points this found exact).

    python benchmarks/reuse_sweep.py N STEP MODEL.gguf [MODEL.gguf ...]
    LO=448 python benchmarks/reuse_sweep.py 600 16 m.gguf        # only reuse points >= 448 (across the n_batch cut)
    FA=1 python benchmarks/reuse_sweep.py 150 2 m.gguf           # with flash attention
    LD_LIBRARY_PATH=$(benchmarks/avx2_ggml.sh) python benchmarks/reuse_sweep.py ...   # the AVX2 kernels

For each reuse point k (multiples of STEP below N): the context holds the prompt's first k tokens followed by 20
other ones, the tail after k is dropped, and the prompt's rest is evaluated in batches cut at absolute multiples
of n_batch (512), with 2 threads and with 1. Every evaluated row's logits are compared with a fresh pass of the
whole prompt; printed: (k, threads) -> (rows in the first batch, first differing row, rows differing).

Measured on a 2-core Sapphire Rapids, AVX-512 and AVX2 builds (2026-12-06; the prompt: texts/ppl_default.txt):
N=150 STEP=2: SmolLM2 Q4_1 none; Q2_K k=144,146 (6 and 4 rows) and on AVX2 also 148 (2 rows); Gemma 3 Q4_K_M every
k = 2 mod 4 (its last row). LO=448 N=600 STEP=16: none, all three. FA=1 N=150 STEP=2, SmolLM2 Q4_1: every row after
k differs at most k (not 44-86). Threads never mattered.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

N_BATCH = 512


def evaluate(llm, tokens: list[int], start: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    rows = []
    while start < len(tokens):
        end = min(len(tokens), (start // N_BATCH + 1) * N_BATCH)
        llm.n_tokens = start
        llm.eval(tokens[start:end])
        rows.append(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(end - start, llm.n_vocab())).copy())
        start = end
    return np.concatenate(rows)


def main() -> int:
    import llama_cpp

    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    n, step, models = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    lo = int(os.environ.get("LO", "0"))
    text = (Path(__file__).resolve().parents[1] / "texts" / "ppl_default.txt").read_text(encoding="utf-8")
    for model in models:
        llm = llama_cpp.Llama(model, n_ctx=2048, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=2, verbose=False,
                              logits_all=True, flash_attn=bool(os.environ.get("FA")))
        tokens = llm.tokenize(text.encode(), add_bos=True)
        prompt, other = tokens[:n], tokens[n + 5 : n + 25]
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        fresh = evaluate(llm, prompt, 0)
        bad = {}
        for k in (k for k in range(step, n - 1, step) if k >= lo):
            for threads in (2, 1):
                llama_cpp.llama_set_n_threads(llm._ctx.ctx, threads, threads)
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
                evaluate(llm, prompt[:k] + other, 0)
                if not llm._ctx.kv_cache_seq_rm(-1, k, -1):
                    print(f"{model}: the cache cannot drop its tail at {k}")
                    continue
                got = evaluate(llm, prompt, k)
                differ = np.flatnonzero((got != fresh[k:]).any(axis=1))
                if len(differ):
                    bad[(k, threads)] = (min(N_BATCH * (k // N_BATCH + 1), n) - k, k + int(differ[0]), len(differ))
            llama_cpp.llama_set_n_threads(llm._ctx.ctx, 2, 2)
        print(f"{Path(model).name} N {n} step {step}: differing (k, threads) -> (rows in first batch, first row, rows):",
              bad or "none", flush=True)
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
