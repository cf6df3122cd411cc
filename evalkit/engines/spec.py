"""What an engine declares about itself: one `EngineSpec` per engine module, read by everything outside
`evalkit/engines/` (config, cache, tokenizer, hardware, ledger, pipeline, variants, plan-time checks).

A spec must be importable without the engine's library: every field that needs the library is a
function that imports it when called. Adding an engine = one module with a `SPEC` plus one line in
`evalkit.engines.ENGINES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
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


SERVED_KIND = "served"  # EngineSpec.model_kind of an engine whose model is behind a server (no local file)


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
class DoctorRow:
    """One line under "Engines and libraries" in `evalkit doctor`."""

    name: str
    version: str | None
    note: str = ""


@dataclass(frozen=True)
class EngineSpec:
    """One engine's declaration.

    - `options_model`: the pydantic model a deployment's `options:` validates against.
    - `model_kind`: the model format the engine loads ("gguf" file or "hf" checkpoint directory), or
      "served": a model reached over the network, so a deployment's `model:` is optional and names the
      weights the server serves when given; `also_loads`: other kinds it accepts.
    - `loader(model_path, options)` -> Engine; `tokenizer_loader(model_path, options)` -> a tokenizer-only
      stand-in with the same token ids (see evalkit/engines/tokenizer.py). Both import the library lazily.
      `model_path` is None for a served model whose weights are not named.
    - `context_option`: the option fixing the context window in tokens (a value of 0/None: the model's own);
      `concurrency_option`: the option bounding the sequences served at once. Plan-time checks and the
      decision read and set these through `context_of` / `at_workload`, never by name. `dtype_option` /
      `quantization_option`: the options naming the serving dtype and a quantization method (the plan's
      weight sizes read them through `dtype_of` / `quantization_of`).
    - `numerics_options`: option names that can change a result (the engine-result cache key includes them).
    - `memory_model(name, arch, weights_bytes, precision, weights_from, options, hw)` -> ledger row.
    - `describe_hardware(deployment)` -> evalkit.hardware.HardwareUse: the device and precision it really
      runs with (a deployment, not only options: llama.cpp's precision is the GGUF file's type).
    - `precision(requested_quantization, compute_capability)` -> evalkit.hardware.Precision.
    - `resources(options)` -> UnitResources for a scheduler.
    - `package`: the distribution(s) whose version identifies the engine (first installed wins);
      `libraries`: other distributions whose versions the manifest records for it.
    - `doctor()` -> list[DoctorRow]: its rows in `evalkit doctor` (default: one per installed `package`);
      `doctor_quantizations`: quantizations whose effective precision doctor shows on each device.
    - `check(deployment)`: engine-specific plan-time checks (raise an EvalkitError: one line, exit 2), run
      before anything else looks at the deployment; `deployment_capabilities(deployment)`: capabilities that
      depend on the deployment (a server's), with reasons for the missing ones (`capabilities_of`).
    - `endpoint(options)` -> dict: where a served model is (for the manifest); never an API key.
    - `format_problem(name)`: why the engine's kernels cannot run a weight-quantization format name
      (evalkit.quant_formats: gptq-w4g128, ...) in one clause, or None; a format no declaring engine runs is
      refused in config. `plan_check(deployment, config_file)`: the one-line problem `evalkit plan` and `run`
      find before anything is written, from local files only (a checkpoint's quantization_config), or None.
    - `kv_precision(options)` -> a short label of the KV cache's precision the options set ("f16", "fp8 (e4m3)",
      ...; read through `kv_precision_of`); None: the engine has no such setting (a served model's server decides).
    - `info_numerics`: keys of the engine's `EngineInfo.extra` that change greedy outputs of the same weights and
      prompt tokens (attention kernel, batch, KV precision); "a.b" reads key b of the dict at key a. The parity
      table names those that differ between two deployments (`evalkit.engines.numeric_settings`).
    - `label`: the engine's name in sentences ("vLLM"); defaults to `name`.
    - `warm_imports`: modules whose import is the part of the engine's start-up that no model or option
      changes (vLLM: about 12 s of a 2-core CPU); a worker started before its run directory exists imports
      them while the driver still prepares the run (`evalkit.executors.warm`).
    - `threads_option`: the option fixing how many CPU threads the engine computes with (unset: every free core);
      a deployment fixed below the cores it may use leaves the others to the next worker's imports
      (`evalkit.executors.order.narrow_deployments`).
    """

    name: str
    options_model: type[BaseModel]
    model_kind: Literal["gguf", "hf", "served"]
    # (model_path, options): model_path is a str except for a served model whose weights are not named (None), so
    # an engine that always loads weights declares `str`; which one a loader gets depends on `model_kind`, a value
    # the type cannot follow, hence Any.
    loader: Callable[[Any, Any], "Engine"]
    tokenizer_loader: Callable[[Any, Any], "Engine"]
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
    context_option: str | None = None
    concurrency_option: str | None = None
    dtype_option: str | None = None  # the option naming the dtype weights are served in ("auto": the checkpoint's)
    quantization_option: str | None = None  # the option asking for a quantization method (e.g. "fp8")
    label: str = ""
    libraries: tuple[str, ...] = ()
    doctor: Callable[[], list[DoctorRow]] | None = None
    doctor_quantizations: tuple[str, ...] = ()
    check: Callable[[Any], None] | None = None
    endpoint: Callable[[Any], dict[str, Any]] | None = None
    warm_imports: tuple[str, ...] = ()
    threads_option: str | None = None
    # Per-deployment capabilities, asked at plan time (a served engine asks its server once per deployment):
    # (capabilities, {missing capability: the server's reason}). May raise an EvalkitError (server unreachable).
    deployment_capabilities: Callable[[Any], tuple[frozenset[Capability], dict[Capability, str]]] | None = None
    # A served deployment's limits, read from its server at plan time: {"top_k": the most log-probs per position
    # by token id, "n_ctx": its context per sequence, "top_k_from"/"n_ctx_from": where each was read}.
    served_limits: Callable[[Any], dict[str, Any]] | None = None
    format_problem: Callable[[str], str | None] | None = None
    plan_check: Callable[[Any, Path], str | None] | None = None
    kv_precision: Callable[[Any], str] | None = None
    info_numerics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        fields = getattr(self.options_model, "model_fields", {})
        named = (self.context_option, self.concurrency_option, self.dtype_option, self.quantization_option)
        for option in (*named, *self.numerics_options):
            if option is not None and option not in fields:
                raise ValueError(f"engine {self.name!r}: option {option!r} is not a field of {self.options_model.__name__}")

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def served(self) -> bool:
        """Whether the engine reaches its model over the network (no local model file is needed)."""
        return self.model_kind == SERVED_KIND

    def context_of(self, options: Any) -> int | None:
        """The context window (tokens) the options fix; None when they leave it to the model (or have none)."""
        value = getattr(options, self.context_option, None) if self.context_option else None
        return value if isinstance(value, int) and value > 0 else None

    def kv_precision_of(self, options: Any) -> str:
        """The KV cache's precision the options set, as a short label; "" where the engine has no such setting."""
        return self.kv_precision(options) if self.kv_precision is not None else ""

    def dtype_of(self, options: Any) -> str | None:
        return getattr(options, self.dtype_option, None) if self.dtype_option else None

    def quantization_of(self, options: Any) -> str | None:
        return getattr(options, self.quantization_option, None) if self.quantization_option else None

    def at_workload(self, options: Any, context_tokens: int, concurrency: int) -> Any:
        """The options set for a workload: the context option at `context_tokens`, the concurrency option
        raised to `concurrency` (an engine configured for more keeps its own)."""
        update: dict[str, Any] = {}
        if self.context_option:
            update[self.context_option] = context_tokens
        if self.concurrency_option:
            current = getattr(options, self.concurrency_option, None)
            update[self.concurrency_option] = max(int(current or 0), concurrency)
        return options.model_copy(update=update)

    def packages(self) -> tuple[str, ...]:
        """Every distribution the manifest records for this engine."""
        return tuple(dict.fromkeys((*self.package, *self.libraries)))

    def capabilities_of(self, deployment: Any) -> tuple[frozenset[Capability], dict[Capability, str]]:
        """What this deployment's engine can do, with a reason per capability it lacks where one is known."""
        if self.deployment_capabilities is None:
            return self.capabilities, {}
        return self.deployment_capabilities(deployment)

    def limits_of(self, deployment: Any) -> dict[str, Any]:
        """A served deployment's limits read from its server (`served_limits`); {} for an in-process engine."""
        return self.served_limits(deployment) if self.served_limits is not None else {}

    def loads_kind(self, kind: str) -> bool:
        return kind == self.model_kind or kind in self.also_loads

    def missing(self, required: frozenset[Capability] | set[Capability]) -> list[Capability]:
        """The required capabilities this engine lacks, in declaration order."""
        return [c for c in Capability if c in required and c not in self.capabilities]
