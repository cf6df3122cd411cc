"""vLLM's memory model for `evalkit plan` (`EngineSpec.memory_model`): what vLLM reserves up front on a GPU or
CPU, its activations and logits, and the KV pool that remains (see evalkit/ledger.py for what a row means).

- On GPU: reserves gpu_memory_utilization x device memory up front; its profile run peaks at
  VLLM_BATCH_TOKENS x (2 x ffn / tp + 4 x hidden) x dtype bytes of activations plus f32 sampler logits
  for max_num_seqs rows; what is left is the KV pool. Its hybrid allocator gives sliding-window layers
  only `window` tokens per sequence.
- On CPU (vLLM >= 0.1x CPU worker) the engine process reserves gpu_memory_utilization x its NUMA node's
  RAM and the KV cache takes what the rest leaves; or VLLM_CPU_KVCACHE_SPACE GiB when set.
"""
from __future__ import annotations

import math
import os
from typing import Any

from evalkit.ledger import CUDA_CONTEXT_BYTES, GB, GIB, ONLINE_FP8, ArchSpec, Hardware, LedgerRow, Workload, _fits_count, arch_weight_bytes

VLLM_BATCH_TOKENS = 8192  # vLLM's chunked-prefill token budget, which its profile run fills
# vLLM on CPU runs three processes: the front end (evalkit's worker: evalkit, vLLM, torch, the tokenizer and
# vLLM's client state), the engine core (the scheduler; torch imported) and the model worker (weights, KV
# cache). Measured on this machine (vllm-cpu 0.32, default config, Gemma 3 270M, high-water marks): front end
# 2.1 GB once serving (0.88 GB after imports and tokenizer alone), engine core 1.2 GB; the model worker's own
# runtime is inside its reservation (the KV cache gets the reservation minus the worker's RSS). A perplexity
# chunk's prompt log-probabilities (chunk x vocab f32) lift the model worker 1.4 GB over its reservation for
# 512-token chunks of a 262,144-token vocabulary: about 3 such arrays (VLLM_LOGITS_ARRAYS).
VLLM_FRONTEND_BYTES = 2 * GB
VLLM_ENGINE_CORE_BYTES = 12 * GB // 10
# evalkit runs the engine core and model worker inside its own worker process on CPU (one worker; see
# vllm_cpu_in_one_process): what the front end holds before the KV cache is sized (imports, tokenizer: 0.88 GB
# above) is then inside the reservation, and only what it gains while serving comes on top.
VLLM_FRONTEND_SERVING_BYTES = VLLM_FRONTEND_BYTES - 88 * GB // 100
VLLM_CPU_CORE_RUNTIME_BYTES = GB  # the model worker's runtime, inside the reservation
VLLM_LOGITS_ARRAYS = 3


def _vllm_cache_bytes(options: Any) -> int:
    if str(options.kv_cache_dtype).startswith("fp8"):
        return 1
    return 4 if str(options.dtype) in ("float32", "float") else 2  # "auto" serves FP32 checkpoints in FP16


def predict_vllm(name: str, arch: ArchSpec, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Hardware,
                 workload: Workload | None = None) -> LedgerRow:  # workload: vLLM's reservation does not depend on it
    tp, max_len, seqs = int(options.tensor_parallel_size), int(options.max_model_len), int(options.max_num_seqs)
    cache_bytes = _vllm_cache_bytes(options)
    act_bytes = 4 if cache_bytes == 4 else 2
    swa_cells = min(max_len, arch.sliding_window) if arch.sliding_window else None
    kv_seq_dev = arch.kv_bytes(max_len, swa_cells, cache_bytes, tp)
    per_tok_dev = arch.kv_bytes_per_token(cache_bytes, tp)
    acts_dev = VLLM_BATCH_TOKENS * (2 * arch.intermediate // tp + 4 * arch.hidden) * act_bytes + seqs * arch.vocab * 4
    notes = []
    if precision == ONLINE_FP8:  # quantized while loading a 16-bit checkpoint
        notes.append("online FP8 from a 16-bit checkpoint: vLLM before 0.14 first loaded all 16-bit weights "
                     f"({arch_weight_bytes(arch, 'FP16') / GB:.1f} GB over the TP group; vllm#4387, fixed by vllm#31914)")
    if hw.gpus:
        budget = hw.gpu_memory_bytes
        reserve = int(options.gpu_memory_utilization * budget)
        fixed_dev = weights_bytes / tp + acts_dev + CUDA_CONTEXT_BYTES
        pool = reserve - fixed_dev
        # What it reserves when that holds the weights and one sequence; else what it would need.
        per_device, n_dev = max(reserve, int(fixed_dev + kv_seq_dev)), tp
        overhead = (acts_dev + CUDA_CONTEXT_BYTES) * tp
        devices = f"{tp}x GPU {budget / GB:.1f} GB"
        fits = tp <= hw.gpus and pool >= kv_seq_dev
        if tp > hw.gpus:
            notes.append(f"tensor_parallel_size {tp} > {hw.gpus} GPU(s)")
        notes.append(f"reserves gpu_memory_utilization {options.gpu_memory_utilization} of each GPU")
    else:
        # vLLM's CPU worker (vllm.v1.worker.cpu_worker): with VLLM_CPU_KVCACHE_SPACE set, that many GiB of KV;
        # else it reserves gpu_memory_utilization x its NUMA node's MemTotal and gives the KV cache whatever
        # its own RSS leaves of that. The KV tensor is torch.zeros, so the reservation is resident. The
        # front-end process (evalkit's worker: torch, the tokenizer) comes on top.
        budget = hw.ram_bytes
        fixed_dev = weights_bytes + acts_dev + VLLM_CPU_CORE_RUNTIME_BYTES
        explicit = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        if explicit:
            pool = float(explicit) * GIB
            core = fixed_dev + pool
            notes.append(f"KV space {explicit} GiB (VLLM_CPU_KVCACHE_SPACE)")
        else:
            node = hw.node_ram_bytes or hw.ram_bytes
            core = math.ceil(options.gpu_memory_utilization * node)
            pool = core - fixed_dev
            notes.append(f"engine process reserves gpu_memory_utilization {options.gpu_memory_utilization} x {node / GB:.1f} GB "
                         f"({'NUMA node' if hw.node_ram_bytes else 'RAM'}); the KV cache gets the rest")
        logit_arrays = VLLM_LOGITS_ARRAYS * (workload.prompt_logprob_rows if workload else 0) * arch.vocab * 4
        if vllm_cpu_in_one_process(tp):
            others, what = VLLM_FRONTEND_SERVING_BYTES, "one process (engine core and worker inside evalkit's): front end serving"
        else:
            others, what = VLLM_FRONTEND_BYTES + VLLM_ENGINE_CORE_BYTES, "front end and engine-core processes"
        processes = others + logit_arrays
        per_device, n_dev = int(core + processes), 1
        overhead = acts_dev + VLLM_CPU_CORE_RUNTIME_BYTES + processes
        notes.append(f"{what} {others / GB:.1f} GB" + (f", prompt log-prob arrays {logit_arrays / GB:.2f} GB" if logit_arrays else ""))
        devices = f"CPU {budget / GB:.1f} GB RAM"
        fits = per_device <= budget and pool >= kv_seq_dev
        if pool < kv_seq_dev:
            notes.append(f"the KV room ({max(pool, 0) / GB:.2f} GB) holds less than one {max_len}-token sequence: vLLM refuses to start")
    max_ctx = mem_ctx = _fits_count(pool, per_tok_dev)
    if arch.context_length and max_ctx > arch.context_length:
        notes.append(f"memory allows {max_ctx:,} tokens of context, capped at the trained {arch.context_length:,}")
        max_ctx = arch.context_length
    max_conc = _fits_count(pool, kv_seq_dev)
    if max_conc < seqs:
        notes.append(f"only {max_conc} of max_num_seqs={seqs} sequences of {max_len} tokens fit at once (the rest wait)")
    if arch.sliding_window:
        notes.append(f"{arch.n_swa_layers}/{arch.n_layers} layers keep {arch.sliding_window} tokens per sequence")
    kv_all = arch.kv_bytes(max_len, swa_cells, cache_bytes) * seqs
    return LedgerRow(
        deployment=name, engine="vllm", precision=precision, weights_from=weights_from, devices=devices,
        n_devices=n_dev, weights_bytes=weights_bytes, kv_bytes_per_token=arch.kv_bytes_per_token(cache_bytes),
        kv_bytes=kv_all, overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv_all + overhead),
        per_device_bytes=per_device, device_budget_bytes=budget, fits=fits,
        max_context=max_ctx, memory_context=mem_ctx, max_concurrency=max_conc, notes="; ".join(notes),
    )




def vllm_cpu_in_one_process(tensor_parallel_size: int) -> bool:
    """Whether vLLM's CPU engine core and model worker run inside evalkit's worker process (evalkit.engines.vllm
    arranges it for one worker unless the user set VLLM_ENABLE_V1_MULTIPROCESSING=1): the memory layout
    predict_vllm assumes."""
    return tensor_parallel_size == 1 and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
