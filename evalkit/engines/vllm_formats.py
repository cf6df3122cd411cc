"""Which GPTQ/AWQ/INT8 formats vLLM's kernels take (the format vocabulary itself is evalkit/quant_formats.py): the
bits and group sizes a format name may have (`EngineSpec.format_problem`), what a pre-quantized checkpoint's
quantization_config must say, the plan-time check of a deployment's format (`EngineSpec.plan_check`) and the
plan's prediction of the CPU backend's linear kernel for the manifest's hardware entry.

What vLLM does with each format on each GPU and release is evalkit/engines/vllm_quant_rules.py; the CPU backend's
kernel choice is evalkit/engines/vllm_kernels.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalkit.quant_formats import QuantFormat, from_hf_config, looks_like_format, name_parts, parse
from evalkit.quant_formats import group_problem as layer_group_problem

# Group sizes vLLM's GPU kernels take for GPTQ in every release since 0.22 (AutoGPTQ verifies Marlin support
# first: vllm/model_executor/layers/quantization/auto_gptq.py:317 in 0.32.0), and Marlin's for AWQ:
# vllm/model_executor/layers/quantization/utils/marlin_utils.py:37 (0.32.0), the same list since 0.6.3 (line 17).
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)
GPTQ_BITS = (2, 3, 4, 8)  # legacy gptq.py (exllama kernels, vLLM <= 0.21): "only 2/3/4/8-bit" (gptq.py:92, 0.21.0)
MARLIN_GPTQ_BITS = (4, 8)  # uint4b8, uint8b128 (auto_gptq.py:99-102, 0.32.0)
AWQ_BITS = (4,)  # auto_awq.py:182-184 (0.32.0); awq.py "only 4-bit" in every older release


def format_problem(name: str) -> str | None:
    """Bits or a group size no vLLM GPU kernel takes for a well-formed format name, in one clause; None when one
    does (EngineSpec.format_problem)."""
    parts = name_parts(name)
    if parts is None or parts[0] not in ("gptq", "awq"):
        return None
    method, bits, group = parts
    allowed_bits = MARLIN_GPTQ_BITS if method == "gptq" else AWQ_BITS
    if bits not in allowed_bits:
        return (f"{name!r}: {method.upper()} with {bits}-bit weights has no vLLM GPU kernel (Marlin, Machete: "
                f"{', '.join(map(str, allowed_bits))}-bit; auto_gptq.py:99-102, auto_awq.py:182-184 in vLLM 0.32.0)")
    return group_size_problem(method, group, name)


def group_size_problem(method: str, group: int, name: str) -> str | None:
    """A group size no kernel of the installed vLLM (0.32) takes on any device: GPTQ goes through Marlin's check on
    every platform (auto_gptq.py:317 -> marlin_utils.py:143-149: -1, 32, 64, 128); AWQ outside Marlin's list runs
    AWQ's GEMM on a GPU (any group dividing the layer) and the CPU WNA16 kernel (even sizes: cpu.py:38)."""
    if method == "gptq" and group not in MARLIN_GROUP_SIZES:
        return (f"{name!r}: group size {group} is not one vLLM's GPTQ kernels take "
                f"({', '.join(str(g) for g in MARLIN_GROUP_SIZES[1:])}, or none for one scale per output channel; "
                "vllm/model_executor/layers/quantization/utils/marlin_utils.py:37, checked for every GPTQ layer at "
                "auto_gptq.py:317 in vLLM 0.32.0)")
    if method == "awq" and group != -1 and (group <= 0 or group % 2):
        return (f"{name!r}: group size {group} is not one vLLM's AWQ kernels take (-1 or a positive even size: "
                "vllm/model_executor/kernels/linear/mixed_precision/cpu.py:38; Marlin -1, 32, 64, 128 on a GPU)")
    return None


def group_problem(fmt: QuantFormat, arch: Any, tp: int = 1) -> str | None:
    """Why the model's layers cannot be split into `fmt`'s groups on `tp` GPUs (each rank's input slice of a
    row-parallel layer must hold whole groups: vLLM's create_weights check), or None."""
    return layer_group_problem(fmt, arch, tp, f"tensor_parallel_size {tp}")


# The methods vLLM 0.32.0 knows (vllm/model_executor/layers/quantization/__init__.py:15-49, QuantizationMethods).
VLLM_METHODS = frozenset({
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed",
    "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors", "experts_int8", "quark",
    "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online", "fp8_per_tensor",
    "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8"})


def checkpoint_problem(config: dict[str, Any], arch: Any = None, tp: int = 1) -> str | None:
    """What is wrong with a pre-quantized checkpoint's quantization_config, in one clause: a method vLLM does not
    know, bits or a group size no kernel takes, a group size that does not divide the model's layers."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method not in VLLM_METHODS:
        return (f"quantization_config.quant_method {method or '(missing)'!r} is not a format vLLM loads (gptq, awq, "
                "compressed-tensors, fp8, ...: vllm/model_executor/layers/quantization/__init__.py:15-49, vLLM 0.32.0)")
    fmt = from_hf_config(config)
    if fmt is None or fmt.checkpoint == "compressed-tensors":
        return group_problem(fmt, arch, tp) if fmt is not None else None
    bits_ok = GPTQ_BITS if fmt.method == "gptq" else AWQ_BITS
    if fmt.bits not in bits_ok:
        return f"quantization_config: {fmt.method.upper()} with {fmt.bits}-bit weights has no vLLM kernel ({', '.join(map(str, bits_ok))}-bit)"
    problem = group_size_problem(fmt.method, fmt.group_size, "quantization_config")
    return problem or group_problem(fmt, arch, tp)


def plan_check(dep: Any, config_file: Path) -> str | None:
    """EngineSpec.plan_check: the one-line problem with a vLLM deployment's quantization format, before anything is
    written: an unknown or unsupported format name (its variant), a checkpoint whose quantization_config no vLLM
    kernel takes, or a variant the CPU backend cannot run on this GPU-less machine. Reads local files only (a model
    not on disk is not checked)."""
    from evalkit.engines.vllm_kernels import deployment_refusal
    from evalkit.quant_formats import name_problem

    model = getattr(dep, "model", None)
    if model is None:
        return None
    if model.variant is not None and looks_like_format(model.variant):
        problem = name_problem(model.variant) or _source_group_problem(dep, config_file)
        return f"deployment {dep.name}: {problem}" if problem else deployment_refusal(dep)
    from evalkit.weights import arch_from_hf_config, local_model_path

    path = local_model_path(model.source, Path(config_file))
    if path is None or not path.is_dir() or not (path / "config.json").is_file():
        return None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the memory plan reports an unreadable config
    try:
        arch = arch_from_hf_config(config, path.name)
    except ValueError:
        arch = None
    problem = checkpoint_problem(config, arch, int(dep.options.tensor_parallel_size or 1))
    return f"deployment {dep.name}: {path / 'config.json'}: {problem}" if problem else None


def _source_group_problem(dep: Any, config_file: Path) -> str | None:
    """A variant's group size that does not divide the source model's layers (per GPU under tensor parallelism),
    read from the source's GGUF header or config.json: `prepare` would refuse it; the plan says so first."""
    from evalkit.weights import local_arch, local_model_path

    fmt = parse(dep.model.variant)
    path = local_model_path(dep.model.source, Path(config_file))
    if fmt is None or path is None:
        return None
    tp = int(dep.options.tensor_parallel_size or 1)
    return layer_group_problem(fmt, local_arch(path), tp, f"{tp} GPUs")  # an unreadable model: no arch, no problem


def planned_kernel(deployment: Any, capability: tuple[int, int] | None) -> dict[str, Any]:
    """The plan's prediction for a GPTQ/AWQ/INT8 variant on vLLM's CPU backend (capability None): the format, the
    linear kernel (evalkit.engines.vllm_kernels), or why no kernel takes it; {} otherwise. The engine's own answer is
    recorded when it loads (engines/<deployment>.json: linear_kernel) and the report puts the two side by side."""
    from evalkit.engines.vllm_kernels import cpu_outcome

    variant = deployment.model.variant if deployment.model is not None else None
    if not variant or not looks_like_format(variant) or capability is not None:
        return {}
    fmt = parse(variant)
    if fmt is None:
        return {}
    kernel, refused = cpu_outcome(fmt)
    return {"quant_format": fmt.describe().replace(f"{fmt.checkpoint} checkpoint", "compressed-tensors checkpoint"),
            "planned_kernel": kernel, "planned_kernel_refused": refused}


def planned_precision(planned: dict[str, Any], variant: str | None) -> Any:
    """The precision of a format variant whose method comes from its checkpoint (no `quantization:` option)."""
    from evalkit.hardware import Precision

    kernel = planned.get("planned_kernel")
    return Precision(
        f"{variant} (compressed-tensors)",
        f"{planned['quant_format']}; vLLM takes the method from the checkpoint's quantization_config (no "
        f"`quantization:` option) and " + (f"runs it on {kernel}" if kernel else "has no CPU kernel for it"),
    )
