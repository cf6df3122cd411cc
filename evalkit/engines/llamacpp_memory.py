"""llama.cpp's memory model for `evalkit plan` (`EngineSpec.memory_model`): weights, KV cache, logits and compute
buffers as llama.cpp allocates them for a deployment's options (see evalkit/ledger.py for what a row means).

- On CPU the budget is RAM and the figures are allocations: llama.cpp's weights are memory-mapped and its
  logits reservation is mostly never touched, so measured RSS is lower (Gemma 3 270M at n_ctx 1024:
  395 MB peak RSS against 913 MB predicted).
- llama.cpp compute buffer: the scheduler reserves f32 logits for a whole ubatch (n_ubatch x vocab x 4;
  514.5 MiB measured vs 512 MiB + 9 MiB predicted for Gemma 3 270M at n_ubatch 512) plus f32
  activations n_ubatch x (ffn + 4 x hidden) x 4; an output buffer of vocab x 4 bytes per sequence.
  llama-cpp-python keeps llama.cpp's default `swa_full = true`: sliding-window layers get a full-size
  cache there ("using full-size SWA cache" in its log), so Gemma's window saves nothing in-process.
"""
from __future__ import annotations

import math
from typing import Any

from evalkit.ledger import GB, Hardware, LedgerRow, Workload, fits_count
from evalkit.weights import ArchSpec

# What llama.cpp holds on each GPU beyond weights, KV cache and its compute buffer: the CUDA context with the
# ggml-cuda kernels loaded and cuBLAS. Calibrated on an H200 (driver 580, CUDA 13, llama.cpp of llama-cpp-python
# 0.3.36 built for sm_90; benchmarks/gpu, issue 21): NVML's peak minus weights, KV (n_ctx 4096) and the compute
# buffer llama.cpp reports (97 MiB) was 1.38 GB for both Q4_K_M and Q8_0 of a SmolLM2-135M-shaped model. The
# earlier 0.5 GB (ledger.CUDA_CONTEXT_BYTES) put the measured peak at 2.1x the prediction.
LLAMACPP_GPU_RUNTIME_BYTES = 1_380_000_000

# A worker's own resident memory beyond weights, KV and logits. llama.cpp, measured on this machine: Python +
# evalkit + llama_cpp imports 138 MB, and 64 MB more after a load (small compute-buffer parts, tokenizer).
RUNTIME_BYTES = GB // 5


# Bytes per cached value of each llama.cpp KV type (ggml's block sizes: q8_0 34 bytes per 32 values, ...).
KV_TYPE_BYTES: dict[str, float] = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                                   "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}


def kv_cache_bytes(arch: ArchSpec, type_k: str, type_v: str) -> float:
    """Bytes per cached value, K and V together, as one figure for ArchSpec's KV sizes: K's head_dim values at
    type_k's size and V's value_dim at type_v's, averaged (f16/f16: 2)."""
    k, v = arch.head_dim, arch.value_dim or arch.head_dim
    return (k * KV_TYPE_BYTES[type_k] + v * KV_TYPE_BYTES[type_v]) / (k + v)


SWA_FULL = True  # llama-cpp-python keeps llama.cpp's default swa_full (see the module docstring)


def swa_cells(arch: ArchSpec, n_ctx: int, n_ubatch: int, swa_full: bool = SWA_FULL) -> int | None:
    """Cells of a windowed layer's KV cache: None for a full-size cache (swa_full), else llama.cpp's
    pad(window x n_seq + n_ubatch, 256), at most n_ctx."""
    if swa_full or not arch.sliding_window:
        return None
    return min(n_ctx, math.ceil((arch.sliding_window + n_ubatch) / 256) * 256)


def predict_llamacpp(name: str, arch: ArchSpec, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Hardware,
                     workload: Workload | None = None) -> LedgerRow:
    n_ctx, n_ubatch = int(options.n_ctx), int(options.n_batch)  # the engine sets n_ubatch = n_batch
    type_k, type_v = getattr(options, "type_k", "f16"), getattr(options, "type_v", "f16")
    cache_bytes = kv_cache_bytes(arch, type_k, type_v)
    cells = swa_cells(arch, n_ctx, n_ubatch)
    kv = arch.kv_bytes(n_ctx, cells, cache_bytes)
    logits = n_ubatch * arch.vocab * 4
    acts = n_ubatch * (arch.intermediate + 4 * arch.hidden) * 4
    # Logit rows one decode returns: evalkit asks only for the rows it scores (the workload), at most a ubatch.
    # On CPU only the rows written are resident: llama.cpp's output buffer (rows x vocab f32) and the same
    # rows of the compute buffer's logits (measured, Gemma 3 270M: +537 MB for 256 rows, +537 MB more for
    # 512). evalkit log-softmaxes them in blocks of 32 rows, which is small.
    rows = min(n_ubatch, workload.scored_rows if workload else n_ubatch)
    out_buf = rows * arch.vocab * 4
    # -1: every layer (llama.cpp's own meaning of a negative count); "auto": every layer where there is a GPU
    # (the engine resolves it on the machine it runs on; the plan, for the planned hardware).
    n_gl = -1 if options.n_gpu_layers == "auto" else int(options.n_gpu_layers)
    on_gpu = hw.gpus > 0 and n_gl != 0
    notes = []
    if on_gpu:
        split = [s for s in (options.tensor_split or [1.0] * hw.gpus) if s > 0][: hw.gpus] or [1.0]
        n_dev, share = len(split), max(split) / sum(split)
        offload = 1.0 if n_gl < 0 else min(1.0, n_gl / (arch.n_layers + 1))  # +1: the output layer
        if offload < 1:
            notes.append(f"{options.n_gpu_layers}/{arch.n_layers + 1} layers offloaded; the rest in RAM")
        budget = hw.gpu_memory_bytes
        fixed_dev = share * offload * weights_bytes + logits + acts + LLAMACPP_GPU_RUNTIME_BYTES  # logits: last device
        per_tok_dev = share * offload * arch.kv_bytes_per_token(cache_bytes)
        per_device = int(fixed_dev + share * offload * kv)
        overhead = logits + acts * n_dev + LLAMACPP_GPU_RUNTIME_BYTES * n_dev + out_buf  # out_buf: host RAM
        devices = f"{n_dev}x GPU {hw.gpu_memory_bytes / GB:.1f} GB"
    else:
        n_dev, budget = 1, hw.ram_bytes
        overhead = 2 * out_buf + acts + RUNTIME_BYTES  # compute-buffer logits: only the rows written
        fixed_dev = weights_bytes + overhead
        notes.append(f"{2 * out_buf / GB:.2f} GB of logits for {rows} scored rows per decode")
        per_tok_dev = arch.kv_bytes_per_token(cache_bytes)
        per_device = int(fixed_dev + kv)
        devices = f"CPU {hw.ram_bytes / GB:.1f} GB RAM"
        if hw.gpus and n_gl == 0:
            notes.append("n_gpu_layers=0: runs on CPU")
    room = budget - fixed_dev
    max_ctx = mem_ctx = fits_count(room, per_tok_dev)
    if arch.context_length and max_ctx > arch.context_length:
        notes.append(f"memory allows {max_ctx:,} tokens of context, capped at the trained {arch.context_length:,}")
        max_ctx = arch.context_length
    kv_dev = kv * (share * offload if on_gpu else 1)
    if arch.sliding_window:
        notes.append(f"{arch.n_swa_layers}/{arch.n_layers} layers windowed ({arch.sliding_window}); " + ("full-size SWA cache (llama.cpp default)" if cells is None else f"{cells} cells"))
    if (type_k, type_v) != ("f16", "f16"):
        notes.append(f"KV cache K {type_k}, V {type_v}")
    notes.append("requests are queued in one context; concurrency = parallel slots memory would allow")
    return LedgerRow(
        deployment=name, engine="llamacpp", precision=precision, weights_from=weights_from, devices=devices,
        n_devices=n_dev, weights_bytes=weights_bytes, kv_bytes_per_token=arch.kv_bytes_per_token(cache_bytes),
        kv_bytes=kv, overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv + overhead),
        per_device_bytes=per_device, device_budget_bytes=budget, fits=per_device <= budget,
        max_context=max_ctx, memory_context=mem_ctx, max_concurrency=fits_count(room, kv_dev), notes="; ".join(notes),
    )


def kv_precision(options: Any) -> str:
    """EngineSpec.kv_precision: type_k / type_v (default f16): "f16", or "K q8_0 / V f16" when they differ. What
    the engine really allocated is its info's `kv_cache`."""
    k, v = getattr(options, "type_k", "f16"), getattr(options, "type_v", "f16")
    return str(k) if k == v else f"K {k} / V {v}"
