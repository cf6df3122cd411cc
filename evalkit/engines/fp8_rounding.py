"""FP8 E4M3 rounding of a weight as vLLM's weight-only FP8 (Marlin, W8A16) computes with it: what the
`fp8-weight` variant stores (evalkit.variants). torch is imported by the caller's tensors, not here."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

FP8_E4M3_MAX = 448.0


def fp8_e4m3(x: "torch.Tensor") -> "torch.Tensor":
    """Cast to float8_e4m3fn saturating at +-448, as vLLM does (it clamps first; torch's own overflow
    behaviour has changed between versions, NaN before saturation)."""
    import torch

    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_channel_scale(weight: "torch.Tensor") -> "torch.Tensor":
    """Per-output-channel scale [out, 1] in fp32: amax(|row|) / 448, floored at 1/(448*512) like vLLM's."""
    amax = weight.float().abs().amax(dim=1, keepdim=True)
    return (amax / FP8_E4M3_MAX).clamp_min(1.0 / (FP8_E4M3_MAX * 512))


def fp8_roundtrip(weight: "torch.Tensor", dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """`weight` [out, in] as vLLM's weight-only FP8 (Marlin, W8A16) computes with it, returned in 16 bits.

    Mirrors vLLM's online per-channel FP8 (vllm/model_executor/layers/quantization/online/fp8.py):
    q = fp8_e4m3(w / scale) with true division in fp32, round to nearest even. Marlin then multiplies the
    FP8 value by the scale *cast to the activation dtype* (`prepare_fp8_layer_for_marlin`:
    `weight_scale.to(orig_dtype)`), so the scale is rounded to `dtype` before the product. `dtype`
    defaults to the weight's own 16-bit dtype, or bfloat16 for an fp32 weight.
    """
    import torch

    if weight.dim() != 2:
        raise ValueError(f"fp8_roundtrip expects a 2-D [out, in] weight, got shape {tuple(weight.shape)}")
    if dtype is None:
        dtype = weight.dtype if weight.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    scale = fp8_channel_scale(weight)
    q = fp8_e4m3(weight.float() / scale)
    return (q.float() * scale.to(dtype).float()).to(dtype)
