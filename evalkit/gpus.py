"""GPU models by name: memory, compute capability, memory bandwidth, FP8 tensor cores, bf16.

`hardware: {gpu: V100-SXM2-16GB, gpus: 2}` in a config names one of these; the plan then knows the budget
per device and, through each engine's rules (EngineSpec.plan_precision), what the engine will really compute
with on that card. A GPU the table lacks can still be described by `gpu_memory_gb` and `compute_capability`.

Figures are the vendors' published ones (NVIDIA data sheets and the CUDA GPUs page,
https://developer.nvidia.com/cuda-gpus, for compute capability). Memory is the published capacity, read as
10^9 bytes like `gpu_memory_gb` everywhere in evalkit: a "16 GB" V100 really shows 16.9e9 bytes to CUDA, so
the plan's budget is about 5% conservative. bf16 tensor cores came with Ampere (8.0); FP8 tensor cores with
Ada (8.9) and Hopper (9.0).

This module knows no engine: what a capability means for vLLM, llama.cpp or transformers lives with each
engine (evalkit/engines/*_rules.py).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuModel:
    name: str  # canonical: the spelling evalkit prints and suggests
    memory_gb: float  # per GPU, 10^9 bytes
    capability: tuple[int, int]
    bandwidth_gb_s: float | None  # memory bandwidth, published (None: not known, e.g. a GPU described in a config)
    fp8_tensor_cores: bool
    bf16: bool  # bf16 tensor cores (Ampere and later)
    aliases: tuple[str, ...] = ()  # other spellings, NVML's device names among them
    source: str = "table"  # "table", or "config" for a GPU described by gpu_memory_gb + compute_capability

    @property
    def capability_str(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"

    def describe(self) -> str:
        """One phrase: name, capability, memory, bandwidth, what its tensor cores do."""
        bw = f", {self.bandwidth_gb_s:,.0f} GB/s" if self.bandwidth_gb_s else ""
        cores = "FP8 and bf16 tensor cores" if self.fp8_tensor_cores else ("bf16 tensor cores, no FP8" if self.bf16 else "no bf16, no FP8 tensor cores")
        return f"{self.name} (compute capability {self.capability_str}, {self.memory_gb:g} GB{bw}; {cores})"


def _gpu(name: str, memory_gb: float, capability: tuple[int, int], bandwidth_gb_s: float, *aliases: str) -> GpuModel:
    return GpuModel(name, memory_gb, capability, bandwidth_gb_s, fp8_tensor_cores=capability >= (8, 9),
                    bf16=capability >= (8, 0), aliases=aliases)


# name, memory GB, compute capability, memory bandwidth GB/s (NVIDIA data sheets), other spellings (NVML's names).
GPUS: tuple[GpuModel, ...] = (
    # Volta (V100 data sheet: 16/32 GB HBM2, 900 GB/s for both PCIe and SXM2)
    _gpu("V100-PCIE-16GB", 16, (7, 0), 900, "Tesla V100-PCIE-16GB"),
    _gpu("V100-PCIE-32GB", 32, (7, 0), 900, "Tesla V100-PCIE-32GB"),
    _gpu("V100-SXM2-16GB", 16, (7, 0), 900, "Tesla V100-SXM2-16GB"),
    _gpu("V100-SXM2-32GB", 32, (7, 0), 900, "Tesla V100-SXM2-32GB"),
    # Turing (T4 data sheet: 16 GB GDDR6, 320 GB/s)
    _gpu("T4", 16, (7, 5), 320, "Tesla T4"),
    # Ampere
    _gpu("A10", 24, (8, 6), 600, "NVIDIA A10"),
    _gpu("A10G", 24, (8, 6), 600, "NVIDIA A10G"),
    _gpu("A100-PCIE-40GB", 40, (8, 0), 1555, "NVIDIA A100-PCIE-40GB"),
    _gpu("A100-SXM4-40GB", 40, (8, 0), 1555, "NVIDIA A100-SXM4-40GB"),
    _gpu("A100-PCIE-80GB", 80, (8, 0), 1935, "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"),
    _gpu("A100-SXM4-80GB", 80, (8, 0), 2039, "NVIDIA A100-SXM4-80GB"),
    _gpu("A40", 48, (8, 6), 696, "NVIDIA A40"),
    _gpu("RTX-3090", 24, (8, 6), 936, "NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
    # Ada Lovelace (FP8 tensor cores)
    _gpu("L4", 24, (8, 9), 300, "NVIDIA L4"),
    _gpu("L40", 48, (8, 9), 864, "NVIDIA L40"),
    _gpu("L40S", 48, (8, 9), 864, "NVIDIA L40S"),
    _gpu("RTX-4090", 24, (8, 9), 1008, "NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    # Hopper (H100 data sheet: PCIe 80 GB HBM2e 2.0 TB/s, SXM 80 GB HBM3 3.35 TB/s, NVL 94 GB 3.9 TB/s;
    # H200: 141 GB HBM3e, 4.8 TB/s)
    _gpu("H100-PCIE-80GB", 80, (9, 0), 2000, "NVIDIA H100 PCIe"),
    _gpu("H100-SXM-80GB", 80, (9, 0), 3350, "NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    _gpu("H100-NVL-94GB", 94, (9, 0), 3900, "NVIDIA H100 NVL"),
    _gpu("H200", 141, (9, 0), 4800, "NVIDIA H200", "H200-SXM-141GB"),
    _gpu("H200-NVL", 141, (9, 0), 4800, "NVIDIA H200 NVL"),
)


def _key(name: str) -> str:
    """Spelling-insensitive key: vendor and product-line words dropped, only letters and digits, upper case
    ("Tesla V100-SXM2-16GB", "v100 sxm2 16gb" and "V100-SXM2-16GB" are one key)."""
    text = re.sub(r"\b(NVIDIA|TESLA|GEFORCE)\b", "", name.upper())
    return re.sub(r"[^A-Z0-9]", "", text)


_BY_KEY: dict[str, GpuModel] = {_key(n): g for g in GPUS for n in (g.name, *g.aliases)}


def lookup(name: str) -> GpuModel | None:
    """The table's GPU for a name (any spelling the table knows, NVML's included); None when unknown."""
    return _BY_KEY.get(_key(name))


def close_matches(name: str, n: int = 3) -> list[str]:
    """Canonical names that look like `name`: those it is a prefix of ("V100" -> the four V100s), then difflib's."""
    key = _key(name)
    prefixed = [g.name for g in GPUS if key and _key(g.name).startswith(key)]
    fuzzy = difflib.get_close_matches(key, [_key(g.name) for g in GPUS], n=n, cutoff=0.5)
    by_key = {_key(g.name): g.name for g in GPUS}
    out = prefixed + [by_key[k] for k in fuzzy if by_key[k] not in prefixed]
    return out[: max(n, len(prefixed))]


def parse_capability(value: object) -> tuple[int, int]:
    """"8.9", 8.9 or "89" (vLLM's integer spelling) -> (8, 9); ValueError otherwise."""
    text = str(value).strip()
    m = re.fullmatch(r"(\d{1,2})\.(\d)", text) or re.fullmatch(r"(\d)(\d)", text)
    if m is None:
        raise ValueError(f"compute capability {value!r} is not MAJOR.MINOR (e.g. 7.0, 8.9)")
    return int(m.group(1)), int(m.group(2))


def resolve(name: str | None, memory_gb: float | None, capability: object | None) -> GpuModel | None:
    """The GPU a config's `hardware:` describes, or None when it names none and gives no capability.

    A name in the table gives memory and capability (`gpu_memory_gb` may still override the memory, e.g. for a
    MIG slice; a contradicting capability is a mistake). A name the table lacks needs both `gpu_memory_gb` and
    `compute_capability`; without them it is a ValueError (one line: the config names the field) listing the
    table's closest names."""
    cap = parse_capability(capability) if capability is not None else None
    if name is None:
        if cap is None:
            return None
        return GpuModel(f"GPU {cap[0]}.{cap[1]}", memory_gb or 0.0, cap, None, cap >= (8, 9), cap >= (8, 0), source="config")
    known = lookup(name)
    if known is not None:
        if cap is not None and cap != known.capability:
            raise ValueError(f"gpu {name!r} has compute capability {known.capability_str}, not {cap[0]}.{cap[1]}")
        if memory_gb is not None and memory_gb != known.memory_gb:
            return GpuModel(known.name, memory_gb, known.capability, known.bandwidth_gb_s, known.fp8_tensor_cores,
                            known.bf16, known.aliases, source="table, memory from gpu_memory_gb")
        return known
    if cap is not None and memory_gb is not None:
        return GpuModel(name, memory_gb, cap, None, cap >= (8, 9), cap >= (8, 0), source="config")
    close = close_matches(name)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown gpu {name!r}: {hint}(for a GPU not in evalkit's table give gpu_memory_gb and compute_capability)")


# ---------------------------------------------------------------------------------------------- plan-time verdicts
# What an engine's rules (EngineSpec.plan_precision) are given and answer. Engines import these types; this
# module imports no engine.


@dataclass(frozen=True)
class ModelFacts:
    """What the rules need to know about a deployment's model before anything is downloaded or loaded."""

    model_type: str | None  # config.json `model_type` or a GGUF's general.architecture ("qwen2", "gemma3", ...)
    checkpoint_dtype: str | None  # config.json torch_dtype ("bfloat16", "float16", "float32"); None: unknown
    arch: Any = None  # evalkit.weights.ArchSpec when known (layers, sizes)
    weights_bytes: int | None = None  # the memory plan's weights
    quant_format: Any = None  # evalkit.quant_formats.QuantFormat of a pre-quantized checkpoint (its quantization_config)


@dataclass(frozen=True)
class GpuVerdict:
    """What one deployment really computes with on a named GPU, before anything loads.

    `dtype`: the compute dtype the engine will use; `quantization`: none, fp8-native, fp8-weight-only, gguf-<type>,
    refused, ...; `refused`: why the engine will not start there (one sentence, the engine's own reason and its
    source), None when it runs; `engine_version`: the version whose rules decided it; `notes`: other versions'
    outcomes where the rule changed, backend and placement, caveats."""

    deployment: str
    engine: str
    gpu: str
    summary: str
    dtype: str | None
    quantization: str
    refused: str | None = None
    engine_version: str | None = None
    notes: tuple[str, ...] = ()
    kernel: str | None = None  # the linear kernel the engine will pick (vLLM's GPTQ/AWQ/INT8 kernel class), when known

    def plan_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "summary": self.summary, "compute_dtype": self.dtype, "quantization": self.quantization,
                "kernel": self.kernel, "refused": self.refused, "engine_version": self.engine_version, "notes": list(self.notes)}
