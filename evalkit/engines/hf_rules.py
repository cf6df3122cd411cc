"""What the transformers (hf) engine computes with on a named GPU, at plan time (EngineSpec.plan_precision).

- dtype: float32 and float16 run on every CUDA GPU; bfloat16 has tensor cores from capability 8.0 (Ampere).
  Below, torch still runs bf16 but emulated: `torch.cuda.is_bf16_supported(including_emulation=False)` is
  False under major 8 (torch 2.13, torch/cuda/__init__.py:204-208), so matmuls are slow.
- the `fp8` variant (native FP8, W8A8 with dynamic activation scales, issue 21 item 3) multiplies with
  torch._scaled_mm on FP8 tensor cores, which need compute capability 8.9 (Ada) or 9.0 (Hopper): torch's own
  tests gate _scaled_mm on SM89OrLater (torch 2.13, torch/testing/_internal/common_methods_invocations.py:18075-18083,
  common_cuda.py:34). Below 8.9 it is refused, never emulated: the `fp8-weight` variant measures FP8 rounding
  in 16-bit instead.
"""
from __future__ import annotations

from typing import Any

from evalkit.gpus import GpuModel, GpuVerdict, ModelFacts
from evalkit.models import NATIVE_FP8_VARIANT

FP8_TENSOR_CORES = (8, 9)
BF16_TENSOR_CORES = (8, 0)


def outcome(capability: tuple[int, int] | None, variant: str | None, dtype: str) -> tuple[str, str | None, str]:
    """(quantization mode, refusal or None, one-line description) for the hf engine on a GPU of `capability`
    (None: no GPU)."""
    cap = f"{capability[0]}.{capability[1]}" if capability else None
    if variant == NATIVE_FP8_VARIANT:
        if capability is None or capability < FP8_TENSOR_CORES:
            where = f"compute capability {cap}" if cap else "no CUDA GPU"
            return ("refused", f"native FP8 (torch._scaled_mm, W8A8) needs FP8 tensor cores, compute capability 8.9 or "
                    f"later; this is {where} [torch 2.13: torch/testing/_internal/common_methods_invocations.py:18083]; the fp8-weight "
                    "variant measures FP8 rounding in 16-bit instead", "refused")
        return "fp8-native", None, f"FP8 native: weights FP8, activations quantized per token to FP8, matmuls on FP8 tensor cores ({cap})"
    if variant == "fp8-weight":
        return "fp8-weight-emulated", None, f"FP8 rounding emulated: a 16-bit checkpoint with FP8-rounded values, computed in {dtype}"
    if dtype == "bfloat16" and capability is not None and capability < BF16_TENSOR_CORES:
        return "none", None, f"computes in bfloat16 emulated (no bf16 tensor cores at {cap}: slow; float16 or float32 runs natively)"
    return "none", None, f"computes in {dtype}"


def plan_precision(deployment: Any, facts: ModelFacts, gpu: GpuModel, hw: Any = None, version: str | None = None) -> GpuVerdict:
    dtype = str(getattr(deployment.options, "dtype", "float32"))
    on_cpu = str(getattr(deployment.options, "device", "auto")) == "cpu"  # the engine's option: the GPU is not used
    variant = getattr(deployment.model, "variant", None)  # a served model may name no weights
    mode, refused, text = outcome(None if on_cpu else gpu.capability, variant, dtype)
    if on_cpu and not refused:
        text += " on the CPU (device: cpu)"
    summary = f"refused: {refused.split(' [')[0]}" if refused else text
    return GpuVerdict(deployment.name, "hf", gpu.name, summary, None if refused else dtype, mode, refused, None, ())
