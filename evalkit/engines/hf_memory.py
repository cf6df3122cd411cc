"""The hf engine's memory model (`EngineSpec.memory_model`): what a transformers deployment needs on its
device before it loads, as `llamacpp_memory` and `vllm_memory` are for those engines."""
from __future__ import annotations

from typing import Any

# What the hf engine holds on a GPU beyond weights, KV cache and activations: the CUDA context, the kernels torch
# and cuBLAS load as the run goes, cuBLAS workspaces, the caching allocator's slack and the CUDA-graph pool.
# Calibrated on an H200 (driver 580, CUDA 13, torch 2.11, transformers 5.17; benchmarks/gpu, issue 21): NVML's
# peak minus weights, KV and activations was 1.9 GB (SmolLM2-135M-shaped, bf16, batch 16) and 2.3 GB
# (Qwen2.5-7B-shaped); the context with one cuBLAS handle alone was 0.77 GB. The earlier 0.5 GB
# (ledger.CUDA_CONTEXT_BYTES) put the measured peak at 2.3x the prediction for the small model.
TORCH_GPU_RUNTIME_BYTES = 2_000_000_000
ROW_BLOCK = 64  # logit rows per block (the engine turns hidden states into logits this many rows at a time): 64 x 262k float32 = 67 MB


def predict_hf(
    name: str, arch: Any, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Any, workload: Any = None
) -> Any:
    """Weights in `dtype`; the KV cache of the larger of one sequence at max_length and the largest
    batch (up to max_batch_size sequences in one static cache of prompt + output tokens, rounded up to 128 as
    the engine allocates it); one block of logits (rows become logits ROW_BLOCK at a time) and a batched
    prefill's attention scores (eager: float32 softmax of batch x heads x prompt x slots)."""
    from evalkit.ledger import GB, LedgerRow, fits_count

    per = 4 if options.dtype == "float32" else 2
    n_ctx = int(options.max_length)
    swa = min(n_ctx, arch.sliding_window) if arch.sliding_window else None  # transformers caches only the window
    kv = arch.kv_bytes(n_ctx, swa, per)
    batch = min(int(options.max_batch_size), workload.batch_sequences) if workload is not None else 1
    slots = min(n_ctx, -(-workload.batch_tokens // 128) * 128) if workload is not None and workload.batch_tokens else 0
    scores = 0
    if batch > 1 and slots:
        kv = max(kv, batch * arch.kv_bytes(slots, min(slots, swa) if swa else None, per))
        scores = batch * arch.n_heads * workload.batch_prompt_tokens * slots * 6  # prefill: 16-bit scores + f32 softmax
    acts = n_ctx * (arch.intermediate + 4 * arch.hidden) * per + 2 * ROW_BLOCK * arch.vocab * 4 + scores
    runtime = GB  # the interpreter with torch and transformers imported
    on_gpu = hw.gpus > 0 and options.device != "cpu"
    if on_gpu:
        budget, fixed = hw.gpu_memory_bytes, weights_bytes + acts + TORCH_GPU_RUNTIME_BYTES
        devices = f"1x GPU {hw.gpu_memory_bytes / GB:.1f} GB"
    else:
        budget, fixed = hw.ram_bytes, weights_bytes + acts + runtime
        devices = f"CPU {hw.ram_bytes / GB:.1f} GB RAM"
    per_tok = arch.kv_bytes_per_token(per)
    mem_ctx = max_ctx = fits_count(budget - fixed, per_tok)
    if arch.context_length and max_ctx > arch.context_length:
        max_ctx = arch.context_length
    overhead = fixed - weights_bytes
    return LedgerRow(
        deployment=name, engine="hf", precision=f"{precision} as {options.dtype}", weights_from=weights_from,
        devices=devices, n_devices=1, weights_bytes=weights_bytes, kv_bytes_per_token=per_tok, kv_bytes=kv,
        overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv + overhead), per_device_bytes=int(fixed + kv),
        device_budget_bytes=budget, fits=fixed + kv <= budget, max_context=max_ctx, memory_context=mem_ctx,
        max_concurrency=max(1, batch), notes=(f"transformers, batches of up to {options.max_batch_size} requests in a static KV cache"
                                              + (f"; {batch} x {slots} tokens for the largest batch a suite sends at once" if batch > 1 and slots else "")),
    )


def kv_precision(options: Any) -> str:
    """EngineSpec.kv_precision: `kv_cache` ("full": the model's `dtype`, else the quantized cache's name)."""
    kv = str(getattr(options, "kv_cache", "full"))
    return str(getattr(options, "dtype", "float32")) if kv == "full" else kv
