"""The run configuration: schema, loading, and one-line validation errors."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator, model_serializer, model_validator,
)
from pydantic_core import PydanticCustomError

from evalkit.errors import ConfigError
from evalkit.metrics.declarations import check_margin_key
from evalkit.metrics.stats import StatsSettings  # the `stats:` section; declared with the statistics
from evalkit.resources import resource_path

CATEGORIES = ("code", "reasoning", "translation", "qa")  # the prompt categories (rating sheets, prompts suite)
VARIANTS = ("hf", "fp8-weight", "fp8", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    """A model: a file or package (`source`), optionally turned into a variant by `prepare`."""

    source: str
    variant: str | None = None

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, v: str | None) -> str | None:
        from evalkit.quant_formats import looks_like_format, name_problem

        if v is not None and looks_like_format(v):  # gptq-w4g64, awq-w4g64, w8a8-int8 (evalkit.quantize makes them)
            problem = name_problem(v)
            if problem:
                raise ValueError(problem)
            return v
        if v is not None and v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r} (expected one of {', '.join(VARIANTS)}, or a quantization format "
                             "such as gptq-w4g64, awq-w4g64, w8a8-int8)")
        return v


class Deployment(_Strict):
    """One model served by one engine. `options` is validated against the engine's own options model
    (its `EngineSpec.options_model`, from the registry in evalkit.engines): config knows no engine.

    `model` may be left out only for an engine whose model is behind a server (its spec's model kind is
    "served"): the model is then what the server serves, its weights unknown to evalkit ("not verified");
    given, it names the weights the server serves (hash, tokenizer, parity)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelRef | None = None
    engine: str
    options: SerializeAsAny[BaseModel] = Field(default=None, validate_default=True)
    replicas: int = Field(default=1, ge=1)  # data-parallel shards of its items (Ray executor: run at once)
    # The suites this deployment runs (None: every enabled one). The others are skipped with the reason in
    # the plan, manifest and report; the decision never recommends it on measurements it lacks.
    suites: list[str] | None = Field(default=None, min_length=1)

    @field_validator("model", mode="before")
    @classmethod
    def _model_from_string(cls, v: Any) -> Any:
        return {"source": v} if isinstance(v, str) else v

    @field_validator("suites")
    @classmethod
    def _known_suites(cls, v: list[str] | None) -> list[str] | None:
        from evalkit.suites import run_suite_names

        names = run_suite_names()
        for name in v or []:
            if name not in names:
                raise ValueError(f"unknown suite {name!r}{_did_you_mean(name, names)} "
                                 f"(suites: {', '.join(names)})")
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"suite {next(n for n in v if v.count(n) > 1)!r} listed twice")
        return v

    @model_validator(mode="after")
    def _model_named_unless_served(self) -> "Deployment":
        from evalkit.engines import engine_spec

        spec = engine_spec(self.engine)
        if self.model is None and not spec.served:
            raise ValueError(f"missing field 'model' (engine {self.engine} loads a {spec.model_kind} model; "
                             "only an engine whose model is served over the network may leave it out)")
        return self

    def runs(self, suite: str) -> bool:
        """True when this deployment's `suites:` list (if it has one) includes `suite`."""
        return self.suites is None or suite in self.suites

    @field_validator("engine")
    @classmethod
    def _registered(cls, v: str) -> str:
        from evalkit.engines import ENGINES, unknown_engine_message

        if v not in ENGINES:
            raise ValueError(unknown_engine_message(v))
        return v

    @field_validator("options", mode="wrap")
    @classmethod
    def _engine_options(cls, v: Any, handler: Any, info: ValidationInfo) -> Any:
        engine = info.data.get("engine")
        if engine is None:  # the engine field already failed; its error is the one to report
            return None
        model = engine_options_model(engine)
        if isinstance(v, model):
            return v
        if isinstance(v, BaseModel):  # another engine's options object
            raise ValueError(f"options of type {type(v).__name__} given to engine {engine!r} (expects {model.__name__})")
        return model.model_validate({} if v is None else v)


def engine_options_model(engine: str) -> type[BaseModel]:
    from evalkit.engines import engine_spec

    return engine_spec(engine).options_model


PositiveInt = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0)]  # numpy's Generator (sampling, seeded suites) rejects negative seeds


class Suites(BaseModel):
    """`suites:` each key a registered suite (evalkit.suites.SUITES), its block validated by that suite's settings
    model (its `SuiteSpec.settings_model`): config knows no suite. A suite left out (or null) is off; reading
    it (`config.suites.<name>` / `config.suites.get(name)`) gives None."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _through_the_registry(cls, data: Any) -> Any:
        from evalkit.suites import run_suite_names, suite_spec

        if data is None or isinstance(data, Suites):
            return {} if data is None else data
        if not isinstance(data, dict):
            raise PydanticCustomError(_SUITES_ERROR, "{message}", {"message": f"suites: expected a mapping (got {data!r})"})
        out: dict[str, Any] = {}
        # a suite scored from the run directory's files (SuiteSpec.runs False) has no block (asked only when there
        # are blocks: the empty default is built while this module loads, before any suite can)
        names = run_suite_names() if data else []
        for name, block in data.items():
            if name not in names:
                message = f"unknown field 'suites.{name}'{_did_you_mean(str(name), names)}"
                raise PydanticCustomError(_SUITES_ERROR, "{message}", {"message": message})
            if block is None:
                continue
            model = suite_spec(name).settings_model
            if isinstance(block, model):
                out[name] = block
                continue
            try:
                out[name] = model.model_validate(block)
            except ValidationError as e:
                message = explain_validation_error(e, block, root=model, prefix=("suites", name))
                raise PydanticCustomError(_SUITES_ERROR, "{message}", {"message": message}) from None
        return out

    @model_serializer(mode="wrap")
    def _every_registered_suite(self, handler: Any, info: Any) -> dict[str, Any]:
        """Every registered suite that runs, in registry order, null when off (the layout manifests have always had)."""
        from evalkit.suites import run_suite_names

        data = handler(self)
        if info.exclude_none:
            return {n: data[n] for n in run_suite_names() if n in data}
        return {n: data.get(n) for n in run_suite_names()}

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            from evalkit.suites import SUITES

            if name in SUITES:
                return None
            raise

    def get(self, name: str) -> BaseModel | None:
        """The settings of suite `name`, None when it is off."""
        return (self.__pydantic_extra__ or {}).get(name)

    def enabled(self) -> list[str]:
        """The suites switched on, in registry order."""
        from evalkit.suites import SUITES

        return [n for n in SUITES if self.get(n) is not None]


_SUITES_ERROR = "suites_error"  # a `suites:` error, already one line (explain_validation_error passes it through)


class Sampling(_Strict):
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1)
    # llama.cpp takes a uint32 seed and treats 0xFFFFFFFF as "pick a random one": never reproducible.
    seed: int = Field(default=0, ge=0, le=2**32 - 2)


VERSION_PATTERN = r"^\d+\.\d+(\.\d+)*([.+-]\w+)*$"  # a release: 0.6.3, 0.22, 1.2.3.post1


class Hardware(_Strict):
    """Devices the deployments must fit on (`evalkit plan`); omitted: this machine (NVML GPUs, else RAM)."""

    gpus: int | None = Field(default=None, ge=0)  # 0 / omitted: CPU only, RAM is the budget (1 when `gpu` is named)
    # A GPU model from evalkit's table (evalkit/gpus.py: V100-SXM2-16GB, T4, A100-SXM4-80GB, L40S, H100-SXM-80GB,
    # H200, ...): memory and compute capability come from it, and the plan applies each engine's rules for it.
    gpu: str | None = None
    gpu_memory_gb: float | None = Field(default=None, gt=0)  # per GPU, 10^9 bytes (overrides the table's)
    compute_capability: str | None = None  # "7.0", for a GPU the table lacks (with gpu_memory_gb)
    ram_gb: float | None = Field(default=None, gt=0)
    # Engine -> the release the target machine runs ({<engine>: "0.6.3"}): the plan applies that release's rules for
    # the named GPU (the engine's EngineSpec.plan_precision) instead of the installed release's.
    engine_versions: dict[str, Annotated[str, Field(pattern=VERSION_PATTERN)]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _old_version_field(cls, data: Any) -> Any:
        """`<engine>_version: X` (the form before engine_versions) is refused with the new form spelled out."""
        if isinstance(data, dict):
            from evalkit.engines import ENGINES

            for key, value in data.items():
                engine = str(key).removesuffix("_version")
                if str(key).endswith("_version") and engine in ENGINES:
                    raise ValueError(f"{key} is now engine_versions: {{{engine}: {value}}}")
        return data

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability_text(cls, v: Any) -> Any:
        return None if v is None else str(v)  # YAML reads 8.9 as a float

    @field_validator("engine_versions", mode="before")
    @classmethod
    def _known_engines(cls, v: Any) -> Any:
        """Keys are registered engines; values are text (YAML reads 0.22 as a float)."""
        if not isinstance(v, dict):
            return v
        from evalkit.engines import ENGINES, unknown_engine_message

        for engine in v:
            if engine not in ENGINES:
                raise ValueError(unknown_engine_message(engine))
        return {k: None if x is None else str(x) for k, x in v.items()}

    @model_validator(mode="after")
    def _known_gpu(self) -> "Hardware":
        from evalkit.gpus import resolve

        resolve(self.gpu, self.gpu_memory_gb, self.compute_capability)  # ValueError: one line, with close names
        return self

    def gpu_model(self) -> Any:
        """The evalkit.gpus.GpuModel this describes (None: no GPU named and no capability given)."""
        from evalkit.gpus import resolve

        return resolve(self.gpu, self.gpu_memory_gb, self.compute_capability)

    def gpu_count(self) -> int:
        return self.gpus if self.gpus is not None else (1 if self.gpu or self.compute_capability else 0)


class Workload(_Strict):
    """The load a deployment must serve: what the decision judges memory and cost at."""

    concurrency: int = Field(default=1, ge=1)  # requests in flight at once
    context_tokens: int = Field(default=2048, ge=1)  # prompt + output tokens of one request
    max_ttft_ms: float | None = Field(default=None, gt=0)  # median time to first token at that concurrency
    min_tokens_per_s: float | None = Field(default=None, gt=0)  # output tokens/s of each request (one user's view)


class Scenario(Workload):
    name: str = Field(pattern=r"^[A-Za-z0-9 _.,:()-]+$")


class DecisionSettings(_Strict):
    """`decision:` which deployment to serve for a workload, given the largest acceptable quality losses."""

    workload: Workload
    # "suite/metric" or "suite/category/metric" -> the worst acceptable value of the tested quantity:
    # a difference from the reference (mmlu/accuracy: -0.02) or, for metrics that only exist against the
    # reference, the value itself (perplexity/ppl_ratio: 1.05). See evalkit/metrics/noninferiority.py.
    margins: dict[str, float] = Field(default_factory=dict)
    scenarios: list[Scenario] = Field(default_factory=list)  # further workloads shown beside the stated one
    # Throughputs within this fraction of the highest are tied (a single measurement varies by a few %);
    # the least memory per device wins among tied deployments.
    throughput_tie: float = Field(default=0.05, ge=0.0, lt=1.0)

    @field_validator("margins")
    @classmethod
    def _known_metrics(cls, v: dict[str, float]) -> dict[str, float]:
        for key in v:
            check_margin_key(key)
        return v

    @model_validator(mode="after")
    def _unique_scenarios(self) -> "DecisionSettings":
        names = [s.name for s in self.scenarios]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate scenario name {dupes[0]!r}")
        return self


class ExecutorSettings(_Strict):
    """Where units of work run: `local` (one subprocess after another) or `ray` (a Ray cluster)."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = None  # ray: None starts a local Ray instance; "auto" or HOST:PORT joins a cluster
    max_attempts: int = Field(default=3, ge=1)  # ray: runs of a unit (after a worker or node died) before it fails
    namespace: str = "evalkit"


JudgeMode = Literal["pointwise", "pairwise"]
JUDGE_MODES: tuple[JudgeMode, ...] = ("pointwise", "pairwise")


class JudgeCertify(_Strict):
    """When a judge is certified for a category (evalkit.judge.score): every condition must hold there."""

    min_items: int = Field(default=50, ge=1)  # rated items (the alpha interval needs 50)
    min_alpha: float = Field(default=0.667, ge=-1.0, le=1.0)  # lower end of judge-vs-human alpha's interval
    max_alpha_gap: float = Field(default=0.1, ge=0.0)  # judge-vs-human alpha at least the raters' own minus this
    min_self_agreement: float = Field(default=0.9, ge=0.0, le=1.0)  # share of outputs given the same score twice
    max_flip_rate: float = Field(default=0.1, ge=0.0, le=1.0)  # pairwise verdicts that change with the order
    max_unparseable: float = Field(default=0.05, ge=0.0, le=1.0)  # share of judge answers not in the format


class JudgeSettings(_Strict):
    """`judge:` a deployment (any engine, in-process or served) that grades the prompts suite's outputs with
    the rubrics (evalkit.judge). Deterministic by default: temperature 0, a fixed seed."""

    deployment: Deployment
    modes: list[JudgeMode] = Field(default_factory=lambda: list(JUDGE_MODES), min_length=1)
    rubrics: str | None = None  # a directory of <category>.md and pairwise.md (None: evalkit's rubrics/)
    categories: list[str] | None = None  # None: every category of the judged outputs
    sampling: Sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=64, seed=0)
    repeats: int = Field(default=2, ge=1, le=2)  # 2: every pointwise judgement twice (self-consistency)
    certify: JudgeCertify = JudgeCertify()


class Config(_Strict):
    reference: str
    hardware: Hardware | None = None
    executor: ExecutorSettings = ExecutorSettings()
    deployments: list[Deployment] = Field(min_length=1)
    suites: Suites = Suites()
    sampling: Sampling = Sampling()
    stats: StatsSettings = StatsSettings()
    noise_floor: bool = False  # run the reference twice to measure the engine's own variation
    decision: DecisionSettings | None = None
    judge: JudgeSettings | None = None  # a model judge of the prompts suite's outputs (evalkit.judge)

    @field_validator("decision")
    @classmethod
    def _margins_on_enabled_suites(cls, v: DecisionSettings | None, info: ValidationInfo) -> DecisionSettings | None:
        suites = info.data.get("suites")
        if v is None or suites is None:
            return v
        from evalkit.suites import run_suite_names

        for key in v.margins:
            suite = key.split("/")[0]
            if suite in run_suite_names() and suites.get(suite) is None:
                raise ValueError(f"margin {key!r}: suite {suite!r} is not enabled under suites:")
        return v

    @model_validator(mode="after")
    def _check_names(self) -> "Config":
        names = [d.name for d in self.deployments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate deployment name {dupes[0]!r}")
        if self.reference not in names:
            hint = _did_you_mean(self.reference, names)
            raise ValueError(f"reference {self.reference!r} is not a deployment name{hint}")
        ref = self.deployment(self.reference)
        enabled = self.suites.enabled()
        lacking = [n for n in enabled if not ref.runs(n)]
        if lacking:  # every comparison of a suite is against the reference's results
            raise ValueError(f"deployments: the reference {ref.name} must run every enabled suite; its suites: list "
                             f"leaves out {', '.join(lacking)}")
        from evalkit.suites import suite_spec

        for name in enabled:  # each suite's own checks across sections (SuiteSpec.config_check)
            check = suite_spec(name).config_check
            if check is not None:
                check(self.suites.get(name), self)
        return self

    def deployment(self, name: str) -> Deployment:
        return next(d for d in self.deployments if d.name == name)


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-"):
            continue  # validator wrapper names are noise for the user
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...], raw: Any = None) -> list[str]:
    """The field names allowed at `loc`, for did-you-mean suggestions (`raw`: the input, to find which
    engine's options model applies under a deployment's `options`)."""
    current: Any = model
    data = raw
    for part in loc[:-1]:
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and part < len(data) else None
            continue
        if current is Deployment and part == "options":
            engine = data.get("engine") if isinstance(data, dict) else None
            try:
                current = engine_options_model(str(engine))
            except KeyError:
                return []
            data = data.get(part) if isinstance(data, dict) else None
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return []
        current = _unwrap(fields[part].annotation)
        data = data.get(part) if isinstance(data, dict) else None
    return list(getattr(current, "model_fields", {}).keys())


def _unwrap(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        inner = _unwrap(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return ann


def explain_validation_error(err: ValidationError, raw: Any = None, root: type[BaseModel] | None = None,
                             prefix: tuple[Any, ...] = ()) -> str:
    """Turn pydantic's multi-line report into the single most useful line (`raw`: the validated input, of model
    `root`, default Config; `prefix`: where that input sits in the config, e.g. ("suites", "mmlu"))."""
    # A typo shows up twice (unknown field + missing field); the unknown one, with its suggestion, helps more.
    priority = {"extra_forbidden": 0, "missing": 3}
    first = min(err.errors(), key=lambda e: priority.get(e["type"], 2))
    if first["type"] == _SUITES_ERROR:  # a suite's block, already explained
        return str(first["msg"])
    loc = prefix + tuple(first["loc"])
    where = _location(loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        field = str(loc[-1])
        hint = _did_you_mean(field, _fields_at(root or Config, tuple(first["loc"]), raw))
        return f"unknown field {where!r}{hint}"
    if first["type"] == "missing":
        if loc[-1] == "engine":
            from evalkit.engines import ENGINES

            return f"missing field {where!r} (registered engines: {', '.join(ENGINES)})"
        return f"missing field {where!r}"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "value_error" and not loc:  # a check across sections names its own fields
        return msg
    return f"{where}: {msg} (got {first.get('input')!r})" if first["type"] != "value_error" else f"{where}: {msg}"


def load_config(path: str | Path | None) -> tuple[Config, Path]:
    """Load and validate a config. Returns it with the file it came from (for relative paths)."""
    file = Path(path) if path is not None else resource_path("default.yaml")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(file), "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(file), f"cannot read: {e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(str(file), f"YAML syntax error{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(str(file), "expected a mapping at the top level")
    try:
        return Config.model_validate(raw), file
    except ValidationError as e:
        raise ConfigError(str(file), explain_validation_error(e, raw)) from None


def resolve_data_path(value: str, config_file: Path) -> Path:
    """A path from a config: absolute, else next to the config, else the working dir, else shipped."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return p
    for base in (config_file.parent, Path.cwd()):
        if (base / p).exists():
            return base / p
    shipped = resource_path(value)
    return shipped if shipped.exists() else config_file.parent / p


def __getattr__(name: str) -> Any:
    """A suite's settings model by its class name (`from evalkit.config import MmluSettings`, where evalkit once
    defined them all): now in the suite's module, found through the registry (SuiteSpec.settings_model)."""
    if name.startswith("__"):  # the import system's probes (`__path__` on every `from module import x`): loading
        raise AttributeError(name)  # every suite for them would import suites that import this module: a cycle
    from evalkit.suites import all_specs

    for spec in all_specs():
        if spec.settings_model.__name__ == name:
            return spec.settings_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
