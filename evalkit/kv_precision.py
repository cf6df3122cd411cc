"""The KV-cache precision of a deployment, as its options set it (the decision table's and report's column).

Each engine names it its own way: llama.cpp `type_k` / `type_v` (default f16), vLLM `kv_cache_dtype` ("auto": the
model's compute dtype), the hf engine `kv_cache` ("full": its `dtype`). What the engine really allocated is in
the manifest's engine info (llama.cpp `kv_cache`, vLLM `kv_cache_ran`)."""
from __future__ import annotations

from typing import Any


def kv_precision(engine: str, options: Any) -> str:
    """A short label: "f16", "K q8_0 / V f16", "fp8 (e4m3)", "bfloat16 (auto)", ...; "" where the engine has no
    such setting (a served model: the server decides)."""
    get = (options.get if isinstance(options, dict) else lambda k, d=None: getattr(options, k, d))
    if engine == "llamacpp":
        k, v = get("type_k", "f16"), get("type_v", "f16")
        return str(k) if k == v else f"K {k} / V {v}"
    if engine == "vllm":
        kv = str(get("kv_cache_dtype", "auto"))
        if kv == "auto":
            return f"{get('dtype', 'auto')} (auto)"
        return {"fp8": "fp8 (e4m3)"}.get(kv, kv)
    if engine == "hf":
        kv = str(get("kv_cache", "full"))
        return str(get("dtype", "float32")) if kv == "full" else kv
    return ""
