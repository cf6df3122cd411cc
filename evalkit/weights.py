"""What a model's files say before anything is loaded: the architecture (layers, heads, sizes, sliding windows)
and the exact bytes of its weights, from a GGUF's header and tensor table, safetensors headers, a safetensors index
or a config.json alone; where a model source is on this machine (never downloading); and the plan's facts about a
deployment's model (`model_facts`: type, checkpoint dtype, architecture, quantization format) for the engines' GPU
rules. The memory ledger (evalkit/ledger.py) and the GPU and disk plans read it.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evalkit.gpus import ModelFacts
from evalkit.models import HF_VARIANTS, ggml_block_size, gguf_file_type_name, read_gguf_header
from evalkit.quant_formats import from_hf_config

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


# -- weights and architecture from files --------------------------------------------------------------


@dataclass(frozen=True)
class WeightsInfo:
    arch: ArchSpec
    weights_bytes: int | None  # bytes of the tensors as stored; None: no tensor sizes in the files present
    precision: str
    non_embedding_bytes: int = 0  # safetensors: bytes outside embedding/lm_head (for FP8 arithmetic)
    source: str = ""  # where the size came from ("gguf tensors", "safetensors", "safetensors index")
    note: str = ""  # e.g. a GGUF whose data section is incomplete


def gguf_tensor_bytes(shape: tuple[int, ...], ggml_type: int) -> int:
    block, size = ggml_block_size(ggml_type)
    return math.prod(shape) // block * size


def gguf_weights(path: Path) -> WeightsInfo:
    """Exact tensor bytes and the architecture from a GGUF's metadata."""
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
        precision = gguf_file_type_name(int(file_type)) if file_type is not None else "?"
    except ValueError:
        precision = f"file_type {file_type}"
    weights = sum(gguf_tensor_bytes(shape, t) for _, shape, t, _ in head.tensors)
    note = ""
    if head.tensors:
        name, shape, t, off = max(head.tensors, key=lambda x: x[3])
        end = head.data_offset + off + gguf_tensor_bytes(shape, t)
        if head.file_size < end:  # a download in progress: the header alone gives every tensor's exact size
            note = f"file incomplete ({head.file_size:,} of {end:,} bytes): sizes from its header's tensor table"
    return WeightsInfo(spec, weights, precision, source="gguf tensors", note=note)


def local_arch(path: Path) -> ArchSpec | None:
    """The architecture of a model on disk: a GGUF file's header, or a checkpoint directory's config.json; None
    when it is neither or cannot be read (the memory plan and the conversion report an unreadable model)."""
    try:
        if path.is_file():
            return gguf_weights(path).arch
        if (path / "config.json").is_file():
            return arch_from_hf_config(json.loads((path / "config.json").read_text()), path.name)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        pass
    return None


def _safetensors_header(path: Path) -> dict[str, Any]:
    # The format is an 8-byte little-endian length and a JSON header with each tensor's dtype, shape and
    # byte range; the safetensors package exposes no byte ranges, and reading them needs no framework.
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


# Per-layer bias parameters a config.json does not spell out: Qwen2 always has q/k/v biases
# (transformers' Qwen2Attention: bias=True on q_proj, k_proj, v_proj); others say so with attention_bias.
_QKV_BIAS_MODEL_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TORCH_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float": "F32", "half": "F16"}


def arch_from_hf_config(config: dict[str, Any], name: str) -> ArchSpec:
    """The architecture from a Hugging Face config.json alone (what is published before any download).

    The parameter count is the gated-MLP decoder's (estimate_params) plus the attention biases the model
    type is known to carry. Raises ValueError naming what it cannot count (mixture-of-experts shapes).
    """
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # multimodal wrappers (Gemma 3 4B+) keep the LM's numbers here
    moe = [k for k in MOE_KEYS if config.get(k)]
    if moe:
        raise ValueError(f"mixture-of-experts config ({moe[0]}={config[moe[0]]}): its parameters are not counted from config.json")
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        n_layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    except KeyError as e:
        raise ValueError(f"config.json has no {e.args[0]}") from None
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    tied = bool(config.get("tie_word_embeddings", True))  # transformers' default is tied
    inter = int(config.get("intermediate_size") or 0)
    params = estimate_params(n_layers, hidden, heads, kv, head_dim, inter, vocab, tied)
    if config.get("model_type") in _QKV_BIAS_MODEL_TYPES:
        params += n_layers * (heads + 2 * kv) * head_dim
    elif config.get("attention_bias"):
        params += n_layers * ((heads + 2 * kv) * head_dim + hidden)
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
    return ArchSpec(
        name=str(config.get("_name_or_path") or name),
        n_layers=n_layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        vocab=vocab,
        n_params=params,
        tied_embeddings=tied,
        intermediate=inter,
        context_length=config.get("max_position_embeddings"),
        sliding_window=int(window) if window and swa else None,
        swa_layers=swa if window else (),
    )


def hf_weights(path: Path) -> WeightsInfo:
    """The architecture from config.json; tensor bytes from the safetensors headers when every shard is
    present, else the index's `total_size` (HF publishes it beside config.json), else unknown (None)."""
    config = json.loads((path / "config.json").read_text())
    arch = arch_from_hf_config(config, path.name)
    total = non_emb = params = 0
    dtypes: set[str] = set()
    files = sorted(path.glob("*.safetensors"))
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else None
    wanted = set((index or {}).get("weight_map", {}).values())
    complete = bool(files) and wanted <= {f.name for f in files}
    if complete:
        for file in files:
            for name, t in _safetensors_header(file).items():
                if name == "__metadata__":
                    continue
                size = t["data_offsets"][1] - t["data_offsets"][0]
                total += size
                params += math.prod(t["shape"])
                dtypes.add(t["dtype"])
                if "embed" not in name and "lm_head" not in name:
                    non_emb += size
        arch = replace(arch, n_params=params)
    declared = _TORCH_DTYPE.get(str(config.get("torch_dtype") or config.get("dtype") or ""), "?")
    precision = "/".join(sorted(dtypes)) or declared
    if complete:
        return WeightsInfo(arch, total, precision, non_emb, source="safetensors")
    total_size = ((index or {}).get("metadata") or {}).get("total_size")
    if total_size:
        missing = len(wanted - {f.name for f in files})
        note = f"{missing} of {len(wanted)} shards not on disk: size from model.safetensors.index.json" if missing < len(wanted) else ""
        return WeightsInfo(arch, int(total_size), precision, source="safetensors index", note=note)
    return WeightsInfo(arch, None, precision, source="config.json")


def local_model_path(source: str, config_file: Path) -> Path | None:
    """The plan's local path for a model source (the ledger, the GPU and disk plans, a suite's plan note):
    beside the config, a `pkg:` package, a path, or an HF repo id already in the local Hugging Face cache (its
    config.json is enough). Never downloads anything."""
    from evalkit.errors import EvalkitError
    from evalkit.models import resolve_source

    if not source.startswith("pkg:") and not Path(source).expanduser().is_absolute():
        near = config_file.parent / source
        if near.exists():
            return near
    try:
        return resolve_source(source)
    except EvalkitError:
        pass
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(source, "config.json")  # a cache lookup: no network
        except Exception:  # no huggingface_hub, malformed repo id: nothing cached
            return None
        return Path(hit).parent if isinstance(hit, str) else None
    return None


_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "float32": "float32", "float": "float32"}


def model_facts(dep: Any, config_file: Path, weights_bytes: int | None = None) -> ModelFacts:
    """The plan's facts about a deployment's model for the engines' GPU rules (EngineSpec.plan_precision): model
    type, checkpoint dtype, architecture and quantization format, from the files present (config.json alone is enough; a
    GGUF's header). Unknown parts are None: the rules then say what they cannot know."""
    if dep.model is None:  # a served model whose weights are not named
        return ModelFacts(None, None, None, weights_bytes)
    path = local_model_path(dep.model.source, Path(config_file))
    if path is None:
        return ModelFacts(None, None, None, weights_bytes)
    model_type = dtype = arch = quant = None
    try:
        if path.is_dir():
            config = json.loads((path / "config.json").read_text())
            model_type = config.get("model_type")
            dtype = _DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or ""))
            quant = from_hf_config(config)
            arch = hf_weights(path).arch
        else:
            model_type = str(read_gguf_header(path).meta.get("general.architecture"))
            arch = gguf_weights(path).arch
    except (OSError, ValueError, KeyError, TypeError) as e:  # the memory plan reports unreadable files
        del e
    if dep.model.variant in HF_VARIANTS and not path.is_dir():
        dtype = "bfloat16"  # evalkit's hf variants of a GGUF are written in bfloat16 (evalkit/variants.py)
    return ModelFacts(model_type, dtype, arch, weights_bytes, quant)


