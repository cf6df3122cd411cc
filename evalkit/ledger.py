"""The memory ledger: what each deployment will hold before anything is loaded, and whether it fits.

Per deployment: weights (exact bytes when the file is on disk: GGUF tensor table, safetensors headers;
else parameters x bits per weight for a known architecture), the KV cache at the configured context and concurrency (sliding-window layers counted the way
the engine allocates them), and a stated headroom for activations and the engine's own reservations.
Sizes are in bytes; the table prints GB = 10^9 bytes, and `hardware.gpu_memory_gb` / `ram_gb` use the
same unit (a "16 GB" V100 shows 16.9e9 bytes to CUDA, so 16e9 is slightly conservative).

Assumptions (each one a constant below, so a measurement can correct it):
- CUDA context, cuBLAS workspaces and NCCL buffers: CUDA_CONTEXT_BYTES per GPU in use.
- Worker process runtime (interpreter, numpy, engine libraries) on CPU: RUNTIME_BYTES per engine.
- On CPU the budget is RAM and the figures are allocations: llama.cpp's weights are memory-mapped and its
  logits reservation is mostly never touched, so measured RSS is lower (Gemma 3 270M at n_ctx 1024:
  395 MB peak RSS against 913 MB predicted).
- llama.cpp compute buffer: the scheduler reserves f32 logits for a whole ubatch (n_ubatch x vocab x 4;
  514.5 MiB measured vs 512 MiB + 9 MiB predicted for Gemma 3 270M at n_ubatch 512) plus f32
  activations n_ubatch x (ffn + 4 x hidden) x 4; an output buffer of vocab x 4 bytes per sequence.
  llama-cpp-python keeps llama.cpp's default `swa_full = true`: sliding-window layers get a full-size
  cache there ("using full-size SWA cache" in its log), so Gemma's window saves nothing in-process.
- vLLM: reserves gpu_memory_utilization x device memory up front; its profile run peaks at
  VLLM_BATCH_TOKENS x (2 x ffn / tp + 4 x hidden) x dtype bytes of activations plus f32 sampler logits
  for max_num_seqs rows; what is left is the KV pool. Its hybrid allocator gives sliding-window layers
  only `window` tokens per sequence. On CPU the KV pool is VLLM_CPU_KVCACHE_SPACE GiB (4 when unset).
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GB = 10**9
GIB = 2**30
CUDA_CONTEXT_BYTES = GB // 2
RUNTIME_BYTES = {"llamacpp": GB // 10, "vllm": GB}  # vLLM imports torch; llama.cpp is one shared library
VLLM_BATCH_TOKENS = 8192  # vLLM's chunked-prefill token budget, which its profile run fills
VLLM_CPU_KV_DEFAULT_GIB = 4

# Bits per weight of llama.cpp's quantization mixes, whole model, as published in llama.cpp's
# examples/quantize/README.md (Llama 2 7B). The _M mixes keep some tensors at more bits: Q4_K_M is Q4_K
# (4.5 bpw) with attn_v/ffn_down of about half the layers and output.weight in Q6_K (6.5625 bpw)
# (src/llama-quant.cpp, llama_tensor_get_type / use_more_bits). Q8_0 is exact: 34 bytes per 32 weights.
GGUF_BPW = {"Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.68, "Q4_K_M": 4.84, "Q3_K_M": 3.91, "Q2_K": 3.35}

# Layers that attend within a sliding window, for GGUFs that do not store the pattern: llama.cpp
# hard-codes it per architecture (hparams.set_swa_pattern(n): layer i is local unless i % n == n - 1).
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4}

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class ArchSpec:
    """What memory depends on in a decoder-only transformer; enough for a prediction without weights."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # key length per head
    vocab: int
    n_params: int
    tied_embeddings: bool
    intermediate: int = 0
    value_dim: int | None = None  # value length per head, when it differs from head_dim
    context_length: int | None = None  # trained context
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()  # True where a layer attends only to the last `sliding_window` tokens

    @property
    def embedding_params(self) -> int:
        """Token embedding plus the output projection (once when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers) if self.sliding_window else 0

    def kv_bytes_per_token_layer(self, cache_bytes: float, tp: int = 1) -> float:
        """One layer, one token, K and V, on one of `tp` devices (KV heads split, replicated if fewer)."""
        heads = math.ceil(self.n_kv_heads / tp)
        return heads * (self.head_dim + (self.value_dim or self.head_dim)) * cache_bytes

    def kv_bytes_per_token(self, cache_bytes: float, tp: int = 1) -> int:
        """All layers as if full attention: layers x KV heads x head dim x 2 (K and V) x cache bytes."""
        return int(self.n_layers * self.kv_bytes_per_token_layer(cache_bytes, tp))

    def kv_bytes(self, full_cells: int, swa_cells: int | None, cache_bytes: float, tp: int = 1) -> int:
        """KV cache with `full_cells` token slots in full-attention layers and `swa_cells` in windowed ones."""
        n_swa = self.n_swa_layers
        swa = full_cells if swa_cells is None else swa_cells
        per_layer = self.kv_bytes_per_token_layer(cache_bytes, tp)
        return int(((self.n_layers - n_swa) * full_cells + n_swa * swa) * per_layer)


def estimate_params(n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, intermediate: int, vocab: int, tied: bool) -> int:
    """Parameters of a gated-MLP decoder (Llama/Qwen/Gemma shape) from its config; biases ignored (<0.01%)."""
    attn = hidden * n_heads * head_dim * 2 + hidden * n_kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * intermediate  # gate, up, down
    return n_layers * (attn + mlp + 2 * hidden) + vocab * hidden * (1 if tied else 2) + hidden


# Qwen2.5-7B (config.json of Qwen/Qwen2.5-7B): the field comparison's model. 7,615,616,512 parameters
# counted tensor by tensor (embeddings 2 x 152064 x 3584, 28 layers of 233,057,792 incl. q/k/v biases).
QWEN2_5_7B = ArchSpec(
    name="Qwen2.5-7B",
    n_layers=28,
    hidden=3584,
    n_heads=28,
    n_kv_heads=4,
    head_dim=128,
    vocab=152064,
    n_params=7_615_616_512,
    tied_embeddings=False,
    intermediate=18944,
    context_length=32768,
)
KNOWN_ARCHS = {"qwen2.5-7b": QWEN2_5_7B}


@dataclass(frozen=True)
class Hardware:
    """The devices a deployment must fit on. gpus == 0: CPU only, RAM is the budget."""

    gpus: int
    gpu_memory_bytes: int
    ram_bytes: int
    source: str = "detected"  # or "config"

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus}x GPU {self.gpu_memory_bytes / GB:.1f} GB"
        return f"CPU, {self.ram_bytes / GB:.1f} GB RAM"


def detect_hardware() -> Hardware:
    """This machine: NVML's GPUs (smallest memory) when pynvml finds any, else RAM."""
    import psutil

    ram = int(psutil.virtual_memory().total)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            mems = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total for i in range(n)]
        finally:
            pynvml.nvmlShutdown()
        if mems:
            return Hardware(gpus=len(mems), gpu_memory_bytes=int(min(mems)), ram_bytes=ram)
    except Exception:  # no pynvml, no driver, no GPU: all mean "CPU"
        pass
    return Hardware(gpus=0, gpu_memory_bytes=0, ram_bytes=ram)


def hardware_from_config(config: Any) -> Hardware:
    """`config.hardware` ({gpus, gpu_memory_gb, ram_gb}) where given, the detected machine otherwise."""
    detected = detect_hardware()
    spec = getattr(config, "hardware", None)
    if spec is None:
        return detected
    gpus = int(getattr(spec, "gpus", 0) or 0)
    gpu_gb = getattr(spec, "gpu_memory_gb", None)
    ram_gb = getattr(spec, "ram_gb", None)
    return Hardware(
        gpus=gpus,
        gpu_memory_bytes=int(gpu_gb * GB) if gpu_gb else (detected.gpu_memory_bytes if gpus else 0),
        ram_bytes=int(ram_gb * GB) if ram_gb else detected.ram_bytes,
        source="config",
    )


@dataclass(frozen=True)
class LedgerRow:
    deployment: str
    engine: str
    precision: str  # e.g. "Q4_K_M", "FP16", "FP8 weights"
    weights_from: str  # "gguf tensors", "safetensors", "architecture x bpw"
    devices: str
    n_devices: int
    weights_bytes: int
    kv_bytes_per_token: int  # all layers, full attention, cache dtype (on one device's share)
    kv_bytes: int  # at the configured context and concurrency, sliding windows as the engine allocates
    overhead_bytes: int  # activations + engine/runtime reservations, all devices
    need_bytes: int  # weights + kv + overhead
    per_device_bytes: int  # busiest device (vLLM: what it reserves up front)
    device_budget_bytes: int
    fits: bool | None
    max_context: int | None  # longest single context the remainder allows, capped at the trained length
    memory_context: int | None  # the same, uncapped: what memory alone allows
    max_concurrency: int | None  # sequences of the configured length the remainder holds at once
    notes: str = ""


# -- weights and architecture from files --------------------------------------------------------------


@dataclass(frozen=True)
class WeightsInfo:
    arch: ArchSpec
    weights_bytes: int  # bytes of the tensors as stored
    precision: str
    non_embedding_bytes: int = 0  # safetensors: bytes outside embedding/lm_head (for FP8 arithmetic)


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY, _SMALL_ARRAY = 8, 9, 4096


@dataclass(frozen=True)
class GgufHeader:
    meta: dict[str, Any]  # scalars, and arrays of at most _SMALL_ARRAY elements as lists
    array_lengths: dict[str, int]  # every array's length (the vocabulary is one)
    tensors: list[tuple[str, tuple[int, ...], int, int]]  # name, shape, ggml type, offset in the data section


def read_gguf_header(path: Path) -> GgufHeader:
    """GGUF v2/v3 metadata and tensor infos, skipping large arrays.

    Written here because gguf.GGUFReader builds numpy views for every array element: 26 s for Gemma 3's
    262,144-token vocabulary on this machine, for a ledger that needs a dozen scalars and tensor shapes.
    """
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str) -> Any:
            nonlocal pos
            (v,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return v

        def string() -> str:
            nonlocal pos
            n = take("<Q")
            pos += n
            return bytes(buf[pos - n : pos]).decode("utf-8", "replace")

        def value(kind: int, key: str) -> Any:
            nonlocal pos
            if kind == _GGUF_STRING:
                return string()
            if kind != _GGUF_ARRAY:
                return take(_GGUF_SCALARS[kind])
            elem, n = take("<I"), take("<Q")
            lengths[key] = n
            if n <= _SMALL_ARRAY:
                return [value(elem, key) for _ in range(n)]
            if elem == _GGUF_STRING:
                for _ in range(n):
                    skip = take("<Q")  # not `pos += take(...)`: that would add to the pre-call pos
                    pos += skip
            else:
                pos += n * struct.calcsize(_GGUF_SCALARS[elem])
            return None

        pos = 4
        if bytes(buf[:4]) != b"GGUF" or take("<I") < 2:  # v1 used 32-bit lengths
            raise ValueError(f"{path}: not a GGUF v2+ file")
        n_tensors, n_kv = take("<Q"), take("<Q")
        meta: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(take("<I"), key)
        tensors = []
        for _ in range(n_tensors):
            name = string()
            shape = tuple(take("<Q") for _ in range(take("<I")))
            tensors.append((name, shape, take("<I"), take("<Q")))
    return GgufHeader(meta, lengths, tensors)


def gguf_tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    import gguf  # block sizes per ggml type: (weights per block, bytes per block)

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    return math.prod(shape) // block * size


def gguf_weights(path: Path) -> WeightsInfo:
    """Exact tensor bytes and the architecture from a GGUF's metadata."""
    import gguf

    head = read_gguf_header(path)
    meta = head.meta
    arch = str(meta.get("general.architecture"))

    def g(key: str, default: Any = None) -> Any:
        v = meta.get(f"{arch}.{key}", default)
        return max(v) if isinstance(v, list) and v and not isinstance(v[0], bool) else v  # per-layer arrays

    n_layers, hidden, heads = int(g("block_count")), int(g("embedding_length")), int(g("attention.head_count"))
    head_dim = int(g("attention.key_length", hidden // heads))
    window = g("attention.sliding_window")
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        swa = tuple(bool(v) for v in pattern)  # per-layer flags, as newer converters write them
    else:
        n = int(pattern or SWA_PATTERN.get(arch, 0))
        swa = tuple((i % n) < (n - 1) for i in range(n_layers)) if n else ()
    spec = ArchSpec(
        name=str(meta.get("general.name", arch)),
        n_layers=n_layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=head_dim,
        value_dim=int(g("attention.value_length", head_dim)),
        vocab=head.array_lengths.get("tokenizer.ggml.tokens") or int(g("vocab_size", 0)),
        n_params=sum(math.prod(shape) for _, shape, _, _ in head.tensors),
        tied_embeddings=all(name != "output.weight" for name, _, _, _ in head.tensors),
        intermediate=int(g("feed_forward_length", 0)),
        context_length=int(g("context_length", 0)) or None,
        sliding_window=int(window) if window and swa else None,
        swa_layers=swa if window else (),
    )
    file_type = meta.get("general.file_type")
    try:
        precision = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else "?"
    except ValueError:
        precision = f"file_type {file_type}"
    weights = sum(gguf_tensor_bytes(shape, t) for _, shape, t, _ in head.tensors)
    return WeightsInfo(spec, weights, precision)


def _safetensors_header(path: Path) -> dict[str, Any]:
    # The format is an 8-byte little-endian length and a JSON header with each tensor's dtype, shape and
    # byte range; the safetensors package exposes no byte ranges, and reading them needs no framework.
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def hf_weights(path: Path) -> WeightsInfo:
    """Tensor bytes from safetensors headers and the architecture from config.json."""
    config = json.loads((path / "config.json").read_text())
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # multimodal wrappers (Gemma 3 4B+) keep the LM's numbers here
    total = non_emb = params = 0
    dtypes: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        for name, t in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size
            params += math.prod(t["shape"])
            dtypes.add(t["dtype"])
            if "embed" not in name and "lm_head" not in name:
                non_emb += size
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    n_layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    tied = bool(config.get("tie_word_embeddings", True))  # transformers' default is tied
    inter = int(config.get("intermediate_size") or 0)
    window = config.get("sliding_window")
    if isinstance(config.get("layer_types"), list):
        swa = tuple(t == "sliding_attention" for t in config["layer_types"])
    elif config.get("sliding_window_pattern"):
        n = int(config["sliding_window_pattern"])
        swa = tuple((i % n) < (n - 1) for i in range(n_layers))
    elif window and config.get("use_sliding_window", True):
        swa = (True,) * n_layers  # Mistral-style: every layer windowed (Qwen2 sets use_sliding_window false)
    else:
        swa = ()
    spec = ArchSpec(
        name=str(config.get("_name_or_path") or path.name),
        n_layers=n_layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        vocab=vocab,
        n_params=params or estimate_params(n_layers, hidden, heads, kv, head_dim, inter, vocab, tied),
        tied_embeddings=tied,
        intermediate=inter,
        context_length=config.get("max_position_embeddings"),
        sliding_window=int(window) if window and swa else None,
        swa_layers=swa if window else (),
    )
    precision = "/".join(sorted(dtypes)) or str(config.get("torch_dtype", "?")).upper()
    return WeightsInfo(spec, total, precision, non_emb)


# -- prediction ------------------------------------------------------------------------------------


def arch_weight_bytes(arch: ArchSpec, precision: str) -> int:
    """Weights in memory from the parameter count: FP32 4, FP16/BF16 2 bytes; FP8 1 byte for the linear
    layers with embeddings and lm_head kept in 16 bits (vLLM quantizes Linear layers only); GGUF mixes
    at llama.cpp's published bits per weight (GGUF_BPW)."""
    p = precision.upper()
    if p in ("FP32", "F32", "FLOAT32"):
        return arch.n_params * 4
    if p in ("FP16", "F16", "BF16", "FLOAT16", "BFLOAT16", "HF"):
        return arch.n_params * 2
    if p.startswith("FP8"):
        return (arch.n_params - arch.embedding_params) + arch.embedding_params * 2
    if precision in GGUF_BPW:
        return int(arch.n_params * GGUF_BPW[precision] / 8)
    raise ValueError(f"unknown precision {precision!r}")


def _fits_count(room: float, each: float) -> int:
    return max(0, int(room // each)) if each > 0 else 0


def predict_llamacpp(name: str, arch: ArchSpec, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Hardware, swa_full: bool = True) -> LedgerRow:
    n_ctx, n_ubatch = int(options.n_ctx), int(options.n_batch)  # the engine sets n_ubatch = n_batch
    cache_bytes = 2  # llama.cpp's default K/V type is f16; evalkit exposes no cache-type option for it
    swa_cells = None
    if not swa_full and arch.sliding_window:  # llama.cpp: pad(window x n_seq + n_ubatch, 256), at most n_ctx
        swa_cells = min(n_ctx, math.ceil((arch.sliding_window + n_ubatch) / 256) * 256)
    kv = arch.kv_bytes(n_ctx, swa_cells, cache_bytes)
    logits = n_ubatch * arch.vocab * 4
    acts = n_ubatch * (arch.intermediate + 4 * arch.hidden) * 4
    out_buf = arch.vocab * 4
    on_gpu = hw.gpus > 0 and int(options.n_gpu_layers) > 0
    notes = []
    if on_gpu:
        split = [s for s in (options.tensor_split or [1.0] * hw.gpus) if s > 0][: hw.gpus] or [1.0]
        n_dev, share = len(split), max(split) / sum(split)
        offload = min(1.0, int(options.n_gpu_layers) / (arch.n_layers + 1))  # +1: the output layer
        if offload < 1:
            notes.append(f"{options.n_gpu_layers}/{arch.n_layers + 1} layers offloaded; the rest in RAM")
        budget = hw.gpu_memory_bytes
        fixed_dev = share * offload * weights_bytes + logits + acts + CUDA_CONTEXT_BYTES  # logits: last device
        per_tok_dev = share * offload * arch.kv_bytes_per_token(cache_bytes)
        per_device = int(fixed_dev + share * offload * kv)
        overhead = logits + acts * n_dev + CUDA_CONTEXT_BYTES * n_dev + out_buf
        devices = f"{n_dev}x GPU {hw.gpu_memory_bytes / GB:.1f} GB"
    else:
        n_dev, budget = 1, hw.ram_bytes
        overhead = logits + acts + out_buf + RUNTIME_BYTES["llamacpp"]
        fixed_dev = weights_bytes + overhead
        per_tok_dev = arch.kv_bytes_per_token(cache_bytes)
        per_device = int(fixed_dev + kv)
        devices = f"CPU {hw.ram_bytes / GB:.1f} GB RAM"
        if hw.gpus and int(options.n_gpu_layers) == 0:
            notes.append("n_gpu_layers=0: runs on CPU")
    room = budget - fixed_dev
    max_ctx = mem_ctx = _fits_count(room, per_tok_dev)
    if arch.context_length and max_ctx > arch.context_length:
        notes.append(f"memory allows {max_ctx:,} tokens of context, capped at the trained {arch.context_length:,}")
        max_ctx = arch.context_length
    kv_dev = kv * (share * offload if on_gpu else 1)
    if arch.sliding_window:
        notes.append(f"{arch.n_swa_layers}/{arch.n_layers} layers windowed ({arch.sliding_window}); " + ("full-size SWA cache (llama.cpp default)" if swa_full else f"{swa_cells} cells"))
    notes.append("requests are queued in one context; concurrency = parallel slots memory would allow")
    return LedgerRow(
        deployment=name, engine="llamacpp", precision=precision, weights_from=weights_from, devices=devices,
        n_devices=n_dev, weights_bytes=weights_bytes, kv_bytes_per_token=arch.kv_bytes_per_token(cache_bytes),
        kv_bytes=kv, overhead_bytes=int(overhead), need_bytes=int(weights_bytes + kv + overhead),
        per_device_bytes=per_device, device_budget_bytes=budget, fits=per_device <= budget,
        max_context=max_ctx, memory_context=mem_ctx, max_concurrency=_fits_count(room, kv_dev), notes="; ".join(notes),
    )


def _vllm_cache_bytes(options: Any) -> int:
    if str(options.kv_cache_dtype).startswith("fp8"):
        return 1
    return 4 if str(options.dtype) in ("float32", "float") else 2  # "auto" serves FP32 checkpoints in FP16


def predict_vllm(name: str, arch: ArchSpec, weights_bytes: int, precision: str, weights_from: str, options: Any, hw: Hardware) -> LedgerRow:
    tp, max_len, seqs = int(options.tensor_parallel_size), int(options.max_model_len), int(options.max_num_seqs)
    cache_bytes = _vllm_cache_bytes(options)
    act_bytes = 4 if cache_bytes == 4 else 2
    swa_cells = min(max_len, arch.sliding_window) if arch.sliding_window else None
    kv_seq_dev = arch.kv_bytes(max_len, swa_cells, cache_bytes, tp)
    per_tok_dev = arch.kv_bytes_per_token(cache_bytes, tp)
    acts_dev = VLLM_BATCH_TOKENS * (2 * arch.intermediate // tp + 4 * arch.hidden) * act_bytes + seqs * arch.vocab * 4
    notes = []
    if hw.gpus:
        budget = hw.gpu_memory_bytes
        reserve = int(options.gpu_memory_utilization * budget)
        fixed_dev = weights_bytes / tp + acts_dev + CUDA_CONTEXT_BYTES
        pool = reserve - fixed_dev
        per_device, n_dev = reserve, tp
        overhead = (acts_dev + CUDA_CONTEXT_BYTES) * tp
        devices = f"{tp}x GPU {budget / GB:.1f} GB"
        fits = tp <= hw.gpus and pool >= kv_seq_dev
        if tp > hw.gpus:
            notes.append(f"tensor_parallel_size {tp} > {hw.gpus} GPU(s)")
        notes.append(f"reserves gpu_memory_utilization {options.gpu_memory_utilization} of each GPU")
    else:
        budget = hw.ram_bytes
        space = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 0) or VLLM_CPU_KV_DEFAULT_GIB
        pool = space * GIB
        fixed_dev = weights_bytes + acts_dev + RUNTIME_BYTES["vllm"]
        per_device, n_dev = int(fixed_dev + pool), 1
        overhead = acts_dev + RUNTIME_BYTES["vllm"]
        devices = f"CPU {budget / GB:.1f} GB RAM"
        fits = per_device <= budget and pool >= kv_seq_dev
        notes.append(f"KV space {space:g} GiB (VLLM_CPU_KVCACHE_SPACE)")
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


def _resolve(source: str, config_file: Path) -> Path | None:
    from evalkit.errors import EvalkitError
    from evalkit.models import resolve_source

    if not source.startswith("pkg:") and not Path(source).expanduser().is_absolute():
        near = config_file.parent / source
        if near.exists():
            return near
    try:
        return resolve_source(source)
    except EvalkitError:
        return None


def _known_arch(source: str) -> ArchSpec | None:
    key = source.lower().replace("_", "-")
    return next((a for k, a in KNOWN_ARCHS.items() if k in key), None)


def deployment_row(dep: Any, config_file: Path, hw: Hardware) -> LedgerRow:
    """One deployment's ledger row, from its file when on disk, else from a known architecture."""
    source, variant, engine = dep.model.source, dep.model.variant, dep.engine
    path = _resolve(source, config_file)
    info: WeightsInfo | None = None
    problem = f"model {source!r} not found"
    if path is not None:
        try:
            info = hf_weights(path) if path.is_dir() else gguf_weights(path)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:  # a corrupt file is a row, not a crash
            problem = f"cannot read {path}: {e}"
    arch = info.arch if info else _known_arch(source)
    if arch is None:
        zero = dict.fromkeys(("n_devices", "weights_bytes", "kv_bytes_per_token", "kv_bytes", "overhead_bytes", "need_bytes", "per_device_bytes", "device_budget_bytes"), 0)
        return LedgerRow(dep.name, engine, variant or "?", "-", hw.describe(), **zero, fits=None, max_context=None, memory_context=None,
                         max_concurrency=None, notes=f"{problem}, and its architecture is not known")
    quant = getattr(dep.options, "quantization", None)
    if variant in ("hf", "fp8-weight"):
        # Both variants are 16-bit checkpoints (fp8-weight only rounds values through FP8; storage stays 16-bit).
        precision = "BF16 (FP8-rounded values)" if variant == "fp8-weight" else "BF16"
        per = 4 if str(getattr(dep.options, "dtype", "auto")) in ("float32", "float") else 2
        weights, weights_from = arch.n_params * per, "parameters x dtype (16-bit variant)"
    elif variant:
        precision = "FP8 weights" if variant == "fp8-weight" else variant
        from_file = info is not None and info.precision.upper().replace("MOSTLY_", "") == variant.upper()
        weights = info.weights_bytes if from_file else arch_weight_bytes(arch, "FP8" if variant == "fp8-weight" else variant)
        weights_from = "gguf tensors" if from_file else "architecture x bpw"
    elif quant == "fp8":  # only engines with a `quantization` option (vLLM) have it
        precision = "FP8 weights"
        if info is not None and info.non_embedding_bytes:  # linear layers to 1 byte, embeddings stay 16-bit
            per = max(DTYPE_BYTES.get(info.precision.split("/")[0], 2), 1)
            weights = info.non_embedding_bytes // per + (info.weights_bytes - info.non_embedding_bytes) * 2 // per
            weights_from = "safetensors"
        else:
            weights, weights_from = arch_weight_bytes(arch, "FP8"), "architecture x bpw"
    elif info is not None and path is not None and not path.is_dir():
        precision, weights, weights_from = info.precision, info.weights_bytes, "gguf tensors"
    elif info is not None:
        precision = info.precision
        per = DTYPE_BYTES.get(info.precision.split("/")[0], 2)
        if str(getattr(dep.options, "dtype", "auto")) in ("float32", "float"):
            weights = arch.n_params * 4
        else:  # 16-bit dtypes; vLLM's "auto" serves FP32 checkpoints as FP16
            weights = info.weights_bytes if per == 2 else arch.n_params * 2
        weights_from = "safetensors"
    else:
        precision, weights, weights_from = "FP16", arch_weight_bytes(arch, "FP16"), "architecture x bpw"
    from evalkit.engines import engine_spec

    predict = engine_spec(engine).memory_model  # the engine's own memory model (predict_llamacpp, predict_vllm, ...)
    row = predict(dep.name, arch, weights, precision, weights_from, dep.options, hw)
    if info is None:
        row = replace(row, notes=f"architecture-only ({arch.name}; file not on disk); " + row.notes)
    return row


def ledger_table(config: Any, config_file: Path) -> list[LedgerRow]:
    hw = hardware_from_config(config)
    return [deployment_row(dep, Path(config_file), hw) for dep in config.deployments]


def _gb(n: int | None) -> str:
    return "-" if n is None else f"{n / GB:.2f}"


def format_ledger(rows: list[LedgerRow]) -> str:
    """A plain-text table (GB = 10^9 bytes) with each row's notes below it."""
    head = ["deployment", "engine", "precision", "weights GB", "KV B/token", "KV GB", "overhead GB", "per device GB", "budget GB", "fits", "max ctx", "max conc"]
    body = [
        [r.deployment, r.engine, r.precision, _gb(r.weights_bytes), f"{r.kv_bytes_per_token:,}", _gb(r.kv_bytes),
         _gb(r.overhead_bytes), _gb(r.per_device_bytes), f"{_gb(r.device_budget_bytes)} ({r.devices})",
         {True: "yes", False: "NO", None: "?"}[r.fits], "-" if r.max_context is None else f"{r.max_context:,}",
         "-" if r.max_concurrency is None else str(r.max_concurrency)]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])]
    for r, cells in zip(rows, body):
        out.append(line(cells))
        if r.notes:
            out.append(f"    {r.weights_from}; {r.notes}")
    return "\n".join(out)
