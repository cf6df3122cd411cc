"""The run configuration: schema, loading, and one-line validation errors."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evalkit.errors import ConfigError
from evalkit.resources import resource_path

CATEGORIES = ("code", "reasoning", "translation", "qa")
VARIANTS = ("hf", "fp8-weight", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Strict):
    """A model: a file or package (`source`), optionally turned into a variant by `prepare`."""

    source: str
    variant: str | None = None

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, v: str | None) -> str | None:
        if v is not None and v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r} (expected one of {', '.join(VARIANTS)})")
        return v


class LlamaCppOptions(_Strict):
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    tensor_split: list[float] | None = None
    n_threads: int | None = None
    n_batch: int = 512
    flash_attn: bool = False  # llama-perplexity defaults to on for CPU; it changes the numbers slightly
    chat_template: Literal["auto", "none"] = "auto"


class VllmOptions(_Strict):
    dtype: str = "auto"
    quantization: str | None = None
    tensor_parallel_size: int = 1
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.3
    max_num_seqs: int = 16
    enforce_eager: bool = True
    kv_cache_dtype: str = "auto"
    chat_template: Literal["auto", "none"] = "auto"
    seed: int = 0


class _DeploymentBase(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelRef

    @field_validator("model", mode="before")
    @classmethod
    def _model_from_string(cls, v: Any) -> Any:
        return {"source": v} if isinstance(v, str) else v


class LlamaCppDeployment(_DeploymentBase):
    engine: Literal["llamacpp"]
    options: LlamaCppOptions = LlamaCppOptions()


class VllmDeployment(_DeploymentBase):
    engine: Literal["vllm"]
    options: VllmOptions = VllmOptions()


Deployment = Annotated[Union[LlamaCppDeployment, VllmDeployment], Field(discriminator="engine")]


class PromptsSuite(_Strict):
    path: str = "prompts/"
    categories: list[Literal["code", "reasoning", "translation", "qa"]] = list(CATEGORIES)
    limit_per_category: int | None = None
    code_timeout_s: float = 10.0


class PerplexitySuite(_Strict):
    text: str = "texts/ppl_default.txt"
    n_ctx: int = 512
    max_chunks: int | None = 4
    top_k: int = Field(default=20, ge=1)


class MmluSuite(_Strict):
    source: str = "builtin"  # "builtin", "hf" (cais/mmlu via datasets) or a local directory
    subjects: list[str] | None = None
    per_subject: int | None = 20
    shots: int = Field(default=5, ge=0, le=5)
    seed: int = 0


class LongContextSuite(_Strict):
    lengths: list[int] = [1024, 2048, 4096, 8192]
    depths: list[float] = [0.1, 0.5, 0.9]
    continuation_tokens: int = 128
    seed: int = 0
    filler: str = "texts/longcontext_filler.txt"


class HumanEvalSuite(_Strict):
    path: str
    limit: int | None = None
    timeout_s: float = 10.0


class CostSuite(_Strict):
    concurrency: list[int] = [1, 4, 8, 16]
    prompt_tokens: int = 128
    output_tokens: int = 256
    repeats: int = 3


class Suites(_Strict):
    prompts: PromptsSuite | None = None
    perplexity: PerplexitySuite | None = None
    mmlu: MmluSuite | None = None
    longcontext: LongContextSuite | None = None
    humaneval: HumanEvalSuite | None = None
    cost: CostSuite | None = None


class Sampling(_Strict):
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1)
    seed: int = 0


class Hardware(_Strict):
    """Devices the deployments must fit on (`evalkit plan`); omitted: this machine (NVML GPUs, else RAM)."""

    gpus: int = Field(default=0, ge=0)  # 0: CPU only, RAM is the budget
    gpu_memory_gb: float | None = Field(default=None, gt=0)  # per GPU, 10^9 bytes
    ram_gb: float | None = Field(default=None, gt=0)


class Config(_Strict):
    reference: str
    hardware: Hardware | None = None
    deployments: list[Deployment] = Field(min_length=1)
    suites: Suites = Suites()
    sampling: Sampling = Sampling()
    noise_floor: bool = False  # run the reference twice to measure the engine's own variation

    @model_validator(mode="after")
    def _check_names(self) -> "Config":
        names = [d.name for d in self.deployments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate deployment name {dupes[0]!r}")
        if self.reference not in names:
            hint = _did_you_mean(self.reference, names)
            raise ValueError(f"reference {self.reference!r} is not a deployment name{hint}")
        return self

    def deployment(self, name: str) -> LlamaCppDeployment | VllmDeployment:
        return next(d for d in self.deployments if d.name == name)


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("llamacpp", "vllm") or str(part).startswith("function-"):
            continue  # discriminator branch names are noise for the user
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed at `loc`, for did-you-mean suggestions."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if part == "llamacpp":
            current = LlamaCppDeployment
            continue
        if part == "vllm":
            current = VllmDeployment
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return []
        ann = fields[part].annotation
        current = _unwrap(ann)
    return list(getattr(current, "model_fields", {}).keys())


def _unwrap(ann: Any) -> Any:
    for arg in getattr(ann, "__args__", ()) or ():
        inner = _unwrap(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return ann


def explain_validation_error(err: ValidationError) -> str:
    """Turn pydantic's multi-line report into the single most useful line."""
    # A typo shows up twice (unknown field + missing field); the unknown one, with its suggestion, helps more.
    priority = {"extra_forbidden": 0, "union_tag_invalid": 1, "union_tag_not_found": 1, "missing": 3}
    first = min(err.errors(), key=lambda e: priority.get(e["type"], 2))
    loc = tuple(first["loc"])
    where = _location(loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        field = str(loc[-1])
        hint = _did_you_mean(field, _fields_at(Config, loc))
        return f"unknown field {where!r}{hint}"
    if first["type"] == "union_tag_invalid":
        got = first.get("input", {}).get("engine") if isinstance(first.get("input"), dict) else None
        return f"{where}: unknown engine {got!r} (expected 'llamacpp' or 'vllm')"
    if first["type"] == "union_tag_not_found":
        return f"{where}: missing field 'engine' (expected 'llamacpp' or 'vllm')"
    if first["type"] == "missing":
        return f"missing field {where!r}"
    msg = first["msg"].removeprefix("Value error, ")
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
        raise ConfigError(str(file), explain_validation_error(e)) from None


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
