"""What llama.cpp runs on a named GPU, at plan time: its backend, how many layers it offloads and where, and
whether the whole model would fit on one card (EngineSpec.plan_precision for llama.cpp).

llama.cpp computes with the GGUF's own types on every GPU its CUDA backend supports: the quantized blocks
are dequantized inside its kernels (no capability-dependent refusal like vLLM's), and it has no FP8 weight
type. Its CUDA backend needs a llama-cpp-python built with `GGML_CUDA=on` (the Makefile does so where nvcc
is present); a CPU build ignores `n_gpu_layers`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from evalkit.gpus import GpuModel, GpuVerdict, ModelFacts


def _layers(n_gpu_layers: int, n_layers: int | None) -> tuple[str, bool]:
    """("29/29 layers", all offloaded?) with llama.cpp's count: the repeating blocks plus the output layer."""
    if n_layers is None:
        return ("every layer" if n_gpu_layers < 0 else f"{n_gpu_layers} layers"), n_gpu_layers < 0
    total = n_layers + 1
    n = total if n_gpu_layers < 0 else min(n_gpu_layers, total)
    return f"{n}/{total} layers", n == total


def plan_precision(deployment: Any, facts: ModelFacts, gpu: GpuModel, hw: Any = None, version: str | None = None) -> GpuVerdict:
    options = deployment.options
    gpus = int(getattr(hw, "gpus", 1) or 1)
    n_gl = -1 if options.n_gpu_layers == "auto" else int(options.n_gpu_layers)  # auto: every layer on a GPU
    variant = getattr(deployment.model, "variant", None)
    gguf = variant if variant not in (None, "hf", "fp8-weight", "fp8") else None
    precision = f"gguf-{gguf}" if gguf else "gguf"
    what = f"the GGUF's {gguf} blocks" if gguf else "the GGUF's own types"
    notes: list[str] = []
    if n_gl == 0:
        return GpuVerdict(deployment.name, "llamacpp", gpu.name, f"CPU backend: n_gpu_layers is 0, so the {gpu.name} is not used",
                          None, precision, None, None, ("set n_gpu_layers: -1 to offload every layer",))
    layers, whole = _layers(n_gl, getattr(facts.arch, "n_layers", None))
    split = [s for s in (options.tensor_split or [1.0]) if s > 0][:gpus]
    where = f"one {gpu.name}" if len(split) == 1 else f"{len(split)} GPUs, tensor_split {list(options.tensor_split or [])}"
    summary = f"CUDA backend, {layers} offloaded to {where}; computes with {what}, dequantized in its kernels"
    if not whole:
        notes.append("the layers not offloaded run on the CPU")
    notes.append("needs llama-cpp-python built with CUDA (GGML_CUDA=on); a CPU build runs everything on the CPU")
    one = _one_card(deployment, facts, hw) if len(split) > 1 else None
    if one is not None:
        notes.append(one)
    return GpuVerdict(deployment.name, "llamacpp", gpu.name, summary, None, precision, None, None, tuple(notes))


def _one_card(deployment: Any, facts: ModelFacts, hw: Any) -> str | None:
    """Whether the model would also fit on a single card (the split is a choice, not a need): the engine's own
    memory model with one GPU and no split."""
    if facts.arch is None or facts.weights_bytes is None or hw is None:
        return None
    from evalkit.engines import engine_spec

    one_gpu = replace(hw, gpus=1)
    options = deployment.options.model_copy(update={"tensor_split": None})
    row = engine_spec("llamacpp").memory_model(deployment.name, facts.arch, facts.weights_bytes, "", "", options, one_gpu)
    if row.per_device_bytes is None:
        return None
    need, budget = row.per_device_bytes / 1e9, row.device_budget_bytes / 1e9
    verdict = "fits on one card" if row.per_device_bytes <= row.device_budget_bytes else "does not fit on one card"
    return f"{verdict}: {need:.2f} GB of {budget:.1f} GB at n_ctx {options.n_ctx} without the split"
