"""What an engine declares about itself: one `EngineSpec` per engine module, read by everything outside
`evalkit/engines/` (config, cache, tokenizer, hardware, ledger, pipeline, variants, plan-time checks).

A spec must be importable without the engine's library: every field that needs the library is a
function that imports it when called. Adding an engine = one module with a `SPEC` plus one line in
`evalkit.engines.ENGINES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from evalkit.engines.base import Engine


class Capability(str, Enum):
    """What an engine can be asked for. Suites declare the ones they need (`Suite.requires`)."""

    GENERATE = "generate"
    PROMPT_LOGPROBS = "prompt log-probs with top-k"  # Engine.score(top_k) / score_span
    NEXT_TOKEN_LOGPROBS = "next-token log-probs at given ids"  # Engine.next_token_logprobs
    FULL_DISTRIBUTION = "full next-token distribution"  # Engine.token_distributions
    CHAT_TEMPLATE = "chat template"
    TOKENIZER = "tokenizer"


@dataclass(frozen=True)
class UnitResources:
    """What one deployment's worker needs from a scheduler (the Ray executor): CPUs, GPUs, and how the GPUs
    are grouped (tensor parallelism: `bundles` placement-group bundles of `gpus_per_bundle` each)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    bundles: int = 1

    @property
    def gpus_per_bundle(self) -> float:
        return self.num_gpus / self.bundles if self.bundles else 0.0


@dataclass(frozen=True)
class EngineSpec:
    """One engine's declaration.

    - `options_model`: the pydantic model a deployment's `options:` validates against.
    - `model_kind`: the model format the engine loads ("gguf" file or "hf" checkpoint directory);
      `also_loads`: other kinds it accepts.
    - `loader(model_path, options)` -> Engine; `tokenizer_loader(model_path, options)` -> a tokenizer-only
      stand-in with the same token ids (see evalkit/engines/tokenizer.py). Both import the library lazily.
    - `numerics_options`: option names that can change a result (the engine-result cache key includes them).
    - `memory_model(name, arch, weights_bytes, precision, weights_from, options, hw)` -> ledger row.
    - `describe_hardware(deployment)` -> evalkit.hardware.HardwareUse: the device and precision it really
      runs with (a deployment, not only options: llama.cpp's precision is the GGUF file's type).
    - `precision(requested_quantization, compute_capability)` -> evalkit.hardware.Precision.
    - `resources(options)` -> UnitResources for a scheduler.
    - `package`: the distribution(s) whose version identifies the engine (first installed wins).
    """

    name: str
    options_model: type[BaseModel]
    model_kind: Literal["gguf", "hf"]
    loader: Callable[[str, Any], "Engine"]
    tokenizer_loader: Callable[[str, Any], "Engine"]
    numerics_options: tuple[str, ...]
    memory_model: Callable[..., Any]
    describe_hardware: Callable[[Any], Any]
    precision: Callable[[str | None, tuple[int, int] | None], Any]
    install_hint: str
    capabilities: frozenset[Capability]
    resources: Callable[[Any], UnitResources]
    package: tuple[str, ...] = ()
    also_loads: tuple[str, ...] = ()  # other model kinds the engine accepts (vLLM: GGUF files, experimental)
    # numerics values -> the values this machine really computes with (vLLM: bf16 runs as float32 on a CPU
    # without native bf16), so the cache never serves one machine's float32 results as another's bf16.
    effective_numerics: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Plan-time hardware truth for a named GPU (`hardware: {gpu: ...}`): (deployment, evalkit.gpus.ModelFacts,
    # evalkit.gpus.GpuModel, ledger.Hardware) -> evalkit.gpus.GpuVerdict (compute dtype, quantization path,
    # refusal with the engine's own source). None: the plan says the engine declares no GPU rules.
    plan_precision: Callable[..., Any] | None = None

    def loads_kind(self, kind: str) -> bool:
        return kind == self.model_kind or kind in self.also_loads

    def missing(self, required: frozenset[Capability] | set[Capability]) -> list[Capability]:
        """The required capabilities this engine lacks, in declaration order."""
        return [c for c in Capability if c in required and c not in self.capabilities]
