"""vLLM's KV-cache precision (`kv_cache_dtype`): what it accepts, what its CPU backend can run, and what the
engine really stored, read back from the loaded model.

Facts from the installed vLLM 0.32 sources:
- `vllm/config/cache.py` CacheDType: the names the option takes (anything else: one line at plan time).
- `vllm/v1/attention/backends/cpu_attn.py`: the CPU backend's `supported_kv_cache_dtypes` are auto, fp8,
  fp8_e4m3 and fp8_e5m2; `_get_attn_isa` refuses an FP8 cache without AVX-512 or AMX, and with a head size
  not divisible by 32.
- `vllm/model_executor/layers/attention/attention.py`: every layer's k/v scales start at 1.0
  (`set_default_quant_scales`) and change only when the checkpoint's quantization config carries KV scales
  (a 16-bit checkpoint has none): an FP8 cache of such a model stores K and V unscaled, clipped at the FP8
  range. Read back per layer (`_k_scale_float`, `_v_scale_float`).
- The cache tensor of an FP8 cache is uint8 (`STR_DTYPE_TO_TORCH_DTYPE`), so its format is not in its dtype:
  `read_back` writes known keys through the layer's own cache-write kernel (`cpu_attn_reshape_and_cache`, its
  ISA and `kv_cache_dtype`) into a scratch block and decodes the bytes both ways; the format whose decoding
  gives back the keys is the one the engine stores (a silent cast such as e4m3 -> e5m2 shows here).
"""
from __future__ import annotations

from typing import Any

# vllm/config/cache.py CacheDType (vLLM 0.32)
CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)
CPU_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # CPUAttentionBackend.supported_kv_cache_dtypes
FP8_CPU_FLAGS = ("avx512f", "amx_tile")  # cpu_attn._get_attn_isa: FP8 KV on CPU needs AVX-512 or AMX


def check_kv_cache_dtype(value: str, cpu: bool, flags: frozenset[str]) -> None:
    """Raise ValueError (one line) for a KV-cache dtype vLLM lacks, or one its CPU backend cannot run here."""
    if value not in CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {value!r} is not one of vLLM's: {', '.join(CACHE_DTYPES)}")
    if not cpu:
        return
    if value not in CPU_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {value!r}: vLLM's CPU backend has only {', '.join(CPU_CACHE_DTYPES)}")
    if value.startswith("fp8") and not any(f in flags for f in FP8_CPU_FLAGS):
        raise ValueError(f"kv_cache_dtype {value!r}: vLLM's CPU backend needs AVX-512 or AMX for an FP8 KV cache "
                         "(neither in /proc/cpuinfo)")


def storage_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per stored K or V element (the memory plan's figure): 1 for the FP8 caches, else the model dtype's."""
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in ("float16", "bfloat16"):
        return 2
    return 4 if model_dtype in ("float32", "float") else 2


def read_back(worker: Any) -> dict[str, Any]:
    """Runs inside vLLM's worker (LLM.collective_rpc): what each attention layer's KV cache really is.

    Returns the layers' kv_cache_dtype strings, the cache tensors' torch dtype and total bytes, the k/v scales
    (min and max over layers, and whether all are vLLM's uncalibrated 1.0) and, for a byte-typed (FP8) cache,
    the format its cache-write kernel really stores. Plain values only (it crosses a process boundary)."""
    import torch
    from vllm.model_executor.layers.attention.attention import Attention

    layers = [m for m in worker.model_runner.model.modules() if isinstance(m, Attention)]
    if not layers:
        return {"layers": 0}
    tensors = [m.kv_cache[0] if isinstance(m.kv_cache, (list, tuple)) else m.kv_cache for m in layers]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.numel()}
    k_scales = [float(m._k_scale_float) for m in layers]
    v_scales = [float(m._v_scale_float) for m in layers]
    out: dict[str, Any] = {
        "layers": len(layers),
        "kv_cache_dtypes": sorted({str(m.kv_cache_dtype) for m in layers}),
        "storage_dtype": str(tensors[0].dtype).removeprefix("torch."),
        "allocated_bytes": sum(storages.values()),
        "k_scale": [min(k_scales), max(k_scales)],
        "v_scale": [min(v_scales), max(v_scales)],
        "scales": "uncalibrated (1.0 in every layer)" if set(k_scales) | set(v_scales) == {1.0}
        else "from the checkpoint",
        "attention_backend": type(layers[0].impl).__name__,
        "isa": getattr(layers[0], "isa", None),
    }
    if tensors[0].dtype == torch.uint8 and out["isa"] is not None:
        out["stored_format"] = _stored_format(worker, layers[0], tensors[0])
    return out


def _stored_format(worker: Any, layer: Any, cache: Any) -> dict[str, Any]:
    """Writes 4 tokens of known keys through the layer's own cache-write kernel into a scratch block (the
    engine's cache is not touched) and decodes the stored bytes as e4m3 and as e5m2: the format whose values
    come back within one step of it (relative error at most 2^-3 for e4m3, 2^-2 for e5m2) is what it stores, and
    whether the kernel rounds to nearest (within half a step) is recorded.
    Compared as sorted magnitudes, so the kernel's layout inside the block does not matter."""
    import torch
    from vllm import _custom_ops as ops

    _, heads, block, two_h = cache.shape
    head = two_h // 2
    scratch = torch.zeros((1, heads, block, two_h), dtype=cache.dtype)
    k_cache, v_cache = scratch.view((1, heads, block * 2, head)).chunk(2, dim=2)
    gen = torch.Generator().manual_seed(0)
    # within both formats' normal range at scale 1.0 (e4m3: up to 448, e5m2: 57344)
    keys = (torch.rand((4, heads, head), generator=gen) * 8 + 0.5).to(worker.model_runner.model_config.dtype)
    k_scale = float(layer._k_scale_float)
    ops.cpu_attn_reshape_and_cache(keys, keys.clone(), k_cache, v_cache, torch.arange(4, dtype=torch.int64), layer.isa,
                                   k_scale=k_scale, v_scale=float(layer._v_scale_float), kv_cache_dtype=layer.kv_cache_dtype)
    want = keys.float().flatten().abs().sort().values
    errors: dict[str, float] = {}
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        got = (k_cache.contiguous().view(dtype).float().flatten().abs() * k_scale).sort().values[-want.numel():]
        errors[name] = float(((got - want).abs() / want).max())
    # One step of the format (relative): 2^-3 for e4m3's 3 mantissa bits, 2^-2 for e5m2's 2. Rounding to nearest
    # stays within half a step; a kernel that truncates, within one.
    step = {"e4m3": 2.0 ** -3, "e5m2": 2.0 ** -2}
    fits = [name for name, err in sorted(errors.items(), key=lambda kv: kv[1]) if err <= step[name]]
    if not fits:
        return {"format": "unknown", "max_rel_error": errors}
    fmt = fits[0]
    rounding = "to nearest" if errors[fmt] <= step[fmt] / 2 else "not to nearest (errors beyond half a step)"
    return {"format": fmt, "rounding": rounding, "max_rel_error": errors}


def requested_format(kv_cache_dtype: str) -> str | None:
    """The FP8 format a kv_cache_dtype name asks for (vLLM: "fp8" means e4m3, utils/torch_utils.py's
    MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP and config/cache.py's doc); None for the others."""
    return {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}.get(kv_cache_dtype)


def summary(requested: str, ran: dict[str, Any]) -> dict[str, Any]:
    """The engine info's `kv_cache_ran`: the read-back, plus `silent_cast` where the stored format is not the
    one asked for."""
    fmt = (ran.get("stored_format") or {}).get("format")
    want = requested_format(requested)
    if want is not None and fmt is not None:
        ran = {**ran, "silent_cast": None if fmt == want else f"{requested} asked ({want}), {fmt} stored"}
    return ran


def kv_precision(options: Any) -> str:
    """EngineSpec.kv_precision: `kv_cache_dtype` ("auto": the model's compute dtype; fp8 is e4m3). What the engine
    really stored is its info's `kv_cache_ran`."""
    kv = str(getattr(options, "kv_cache_dtype", "auto"))
    if kv == "auto":
        return f"{getattr(options, 'dtype', 'auto')} (auto)"
    return {"fp8": "fp8 (e4m3)"}.get(kv, kv)
