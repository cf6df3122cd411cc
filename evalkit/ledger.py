"""The memory ledger: what each deployment will hold before anything is loaded, and whether it fits.

Per deployment: weights (exact bytes when the file is on disk: GGUF tensor table, safetensors headers;
else parameters x bits per weight for a known architecture), the KV cache at the configured context and concurrency (sliding-window layers counted the way
the engine allocates them), and a stated headroom for activations and the engine's own reservations.
Sizes are in bytes; the table prints GB = 10^9 bytes, and `hardware.gpu_memory_gb` / `ram_gb` use the
same unit (a "16 GB" V100 shows 16.9e9 bytes to CUDA, so 16e9 is slightly conservative).

Assumptions (each one a constant below, so a measurement can correct it):
- CUDA context, cuBLAS workspaces and NCCL buffers: CUDA_CONTEXT_BYTES per GPU in use.
- Each engine's own allocations (runtime, activations, logits, KV cache layout, reservations) are its
  memory model (`EngineSpec.memory_model`, in evalkit/engines/): this module knows no engine. A model
  served by a server evalkit does not run (no weights named) is a row "on the server" with fits unknown.

Before download: an HF config.json alone gives the architecture and the parameter count (weights are then
an estimate, labelled); a safetensors index gives the exact bytes; a GGUF's header alone gives every
tensor's exact size. A size that cannot be known is None ("unknown"), and then `fits` is None, never True.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from evalkit.weights import DTYPE_BYTES, ArchSpec, WeightsInfo, gguf_weights, hf_weights, local_model_path, model_facts

GB = 10**9
GIB = 2**30
ONLINE_FP8 = "FP8 weights"  # precision of a 16-bit checkpoint quantized to FP8 as it loads
SERVER_DEVICES = "on the server"  # LedgerRow.devices of a served model whose memory evalkit cannot see
CUDA_CONTEXT_BYTES = GB // 2
# Bits per weight of llama.cpp's quantization mixes, whole model, as published in llama.cpp's
# examples/quantize/README.md (Llama 2 7B). The _M mixes keep some tensors at more bits: Q4_K_M is Q4_K
# (4.5 bpw) with attn_v/ffn_down of about half the layers and output.weight in Q6_K (6.5625 bpw)
# (src/llama-quant.cpp, llama_tensor_get_type / use_more_bits). Q8_0 is exact: 34 bytes per 32 weights.
GGUF_BPW = {"Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.68, "Q4_K_M": 4.84, "Q3_K_M": 3.91, "Q2_K": 3.35}

@dataclass(frozen=True)
class Hardware:
    """The devices a deployment must fit on. gpus == 0: CPU only, RAM is the budget."""

    gpus: int
    gpu_memory_bytes: int
    ram_bytes: int
    source: str = "detected"  # or "config"
    gpu: Any = None  # the GPU model (evalkit.gpus.GpuModel) when the config names one or gives its capability
    versions: dict[str, str] = field(default_factory=dict)  # engine -> the release the target runs (config: engine_versions)

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus}x {self.gpu.name if self.gpu is not None else 'GPU'} {self.gpu_memory_bytes / GB:.1f} GB"
        return f"CPU, {self.ram_bytes / GB:.1f} GB RAM"


# Where a memory-limited cgroup states its limit (v2, then v1). v1 writes a huge number when unlimited.
CGROUP_MEMORY_LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _cgroup_memory_limit() -> int | None:
    """The memory limit of this process's cgroup (a container, a CI job), None where there is none: inside one,
    the machine's RAM is not what a deployment may use (vLLM's CPU worker reads the same files)."""
    for path in CGROUP_MEMORY_LIMIT_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 62:
            return int(text)
    return None


def _ram_bytes() -> int:
    """RAM a deployment may use: the machine's, or its cgroup's limit when lower."""
    import psutil

    ram = int(psutil.virtual_memory().total)
    limit = _cgroup_memory_limit()
    return min(ram, limit) if limit else ram


def detect_hardware() -> Hardware:
    """This machine: NVML's GPUs (smallest memory) when pynvml finds any, else RAM (a cgroup's limit when lower)."""
    ram = _ram_bytes()
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
    """`config.hardware` ({gpu, gpus, gpu_memory_gb, compute_capability, ram_gb}) where given, the detected
    machine otherwise. A named GPU model (evalkit.gpus) gives the memory per GPU unless gpu_memory_gb says it."""
    spec = getattr(config, "hardware", None)
    if spec is None:
        return detect_hardware()
    gpu = spec.gpu_model() if hasattr(spec, "gpu_model") else None
    gpus = spec.gpu_count() if hasattr(spec, "gpu_count") else int(getattr(spec, "gpus", 0) or 0)
    gpu_gb = getattr(spec, "gpu_memory_gb", None) or (gpu.memory_gb if gpu is not None and gpu.memory_gb else None)
    ram_gb = getattr(spec, "ram_gb", None)
    detected = detect_hardware() if (gpus and not gpu_gb) or not ram_gb else None
    return Hardware(
        gpus=gpus,
        gpu_memory_bytes=int(gpu_gb * GB) if gpu_gb else (detected.gpu_memory_bytes if gpus and detected else 0),
        ram_bytes=int(ram_gb * GB) if ram_gb else (detected.ram_bytes if detected is not None else 0),  # detected: without ram_gb
        source="config",
        gpu=gpu if gpus else None,
        versions=dict(getattr(spec, "engine_versions", None) or {}),
    )


@dataclass(frozen=True)
class LedgerRow:
    """One deployment's memory plan. A size that cannot be known is None (never 0), and then `fits` is None."""

    deployment: str
    engine: str
    precision: str  # e.g. "Q4_K_M", "BF16", "FP8 weights"
    weights_from: str  # "gguf tensors", "safetensors", "safetensors index", "estimate: ..." or "unknown"
    devices: str
    n_devices: int
    weights_bytes: int | None
    kv_bytes_per_token: int | None  # all layers, full attention, cache dtype (whole model, not a device's share)
    kv_bytes: int | None  # at the configured context and concurrency, sliding windows as the engine allocates
    overhead_bytes: int | None  # activations + engine/runtime reservations, all devices
    need_bytes: int | None  # weights + kv + overhead
    per_device_bytes: int | None  # busiest device (vLLM: what it reserves up front); on CPU: the worker's RAM
    device_budget_bytes: int | None  # None: not this machine's (a server evalkit does not run)
    fits: bool | None
    max_context: int | None  # longest single context the remainder allows, capped at the trained length
    memory_context: int | None  # the same, uncapped: what memory alone allows
    max_concurrency: int | None  # sequences of the configured length the remainder holds at once
    notes: str = ""
    estimate: bool = False  # weights from an architecture and a precision, not from the files to be loaded
    # The KV cache evalkit gives the engine per device (where its memory model sets one), the figure the engine
    # passes; None where the engine sizes its own. The manifest's ledger carries it beside kv_bytes.
    kv_given_bytes: int | None = None
    kv_given_from: str | None = None

    def plan_json(self) -> dict[str, Any]:
        """The `evalkit plan --json` record (GB = 10^9 bytes; unknown sizes are null)."""
        def gb(n: int | None) -> float | None:
            return None if n is None else round(n / GB, 3)

        return {
            "deployment": self.deployment, "engine": self.engine, "precision": self.precision,
            "weights_gb": gb(self.weights_bytes), "weights_from": self.weights_from, "estimate": self.estimate,
            "kv_bytes_per_token": self.kv_bytes_per_token, "per_device_gb": gb(self.per_device_bytes),
            "n_devices": self.n_devices, "budget_gb": gb(self.device_budget_bytes), "fits": self.fits,
            "max_context": self.max_context, "max_concurrency": self.max_concurrency, "notes": self.notes,
            "kv_given_gb": gb(self.kv_given_bytes), "kv_given_from": self.kv_given_from,
        }


def _unknown_weights(row: LedgerRow, reason: str) -> LedgerRow:
    """A row whose weights are not known: every figure that depends on them becomes unknown, fits too."""
    return replace(row, weights_bytes=None, need_bytes=None, per_device_bytes=None, fits=None, max_context=None,
                   memory_context=None, max_concurrency=None, weights_from="unknown", estimate=False,
                   notes=f"weights unknown: {reason}" + (f"; {row.notes}" if row.notes else ""))


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


def fits_count(room: float, each: float) -> int:
    """How many things of `each` bytes fit in `room` bytes (0 when none, or nothing has a size): the engines'
    memory models count tokens and sequences with it."""
    return max(0, int(room // each)) if each > 0 else 0


@dataclass(frozen=True)
class Workload:
    """What the enabled suites ask of an engine beyond its options: the most logit rows one decode returns
    (everything asks for the last row at least), prompt log-probability rows, and the largest batch of requests
    that arrive together with the tokens each holds (an engine that decodes them as one batch holds their KV
    cache at once). None of it is known from a deployment alone: each suite's SuiteSpec.workload says it."""

    scored_rows: int = 1
    prompt_logprob_rows: int = 0  # rows of prompt log-probabilities one request asks for (vLLM: the whole chunk)
    batch_sequences: int = 1
    batch_tokens: int = 0
    batch_prompt_tokens: int = 0


def workload_of(config: Any) -> Workload:
    """The Workload of `config`'s enabled suites: each field the largest any of them asks for."""
    from evalkit.suites import all_specs

    suites = getattr(config, "suites", None)
    need = asdict(Workload())
    for spec in all_specs():
        settings = getattr(suites, spec.name, None)
        if settings is None or spec.workload is None:
            continue
        for k, v in spec.workload(settings).items():
            need[k] = max(need[k], int(v))
    return Workload(**need)


def _built_variant(source: str, path: Path, variant: str) -> Path | None:
    """The prepared variant when `evalkit prepare` has already made it (file sources only: hashing a whole
    checkpoint directory to find its cache entry would cost more than the plan is worth)."""
    if path.is_dir():
        return None
    from evalkit.variants import built_variant

    try:
        return built_variant(source, variant)
    except Exception:  # an unreadable cache entry means "not built": the plan estimates instead
        return None


def _memory_model(engine: str) -> Callable[..., LedgerRow] | None:
    """The engine's own memory model (EngineSpec.memory_model: predict_llamacpp, predict_vllm, ...); None for
    an engine that declares none, whose rows are then unknown."""
    from evalkit.engines import engine_spec

    try:
        return engine_spec(engine).memory_model
    except KeyError:
        return None


@dataclass(frozen=True)
class _Weights:
    bytes: int | None  # None: unknown
    precision: str
    source: str  # weights_from
    estimate: bool = False
    notes: tuple[str, ...] = ()


def _dtype_bytes(dtype: str | None, checkpoint: str) -> tuple[int, str]:
    """Bytes per parameter a 16-bit-or-wider checkpoint is served in: the engine's dtype (its spec's
    `dtype_option`), else the checkpoint's ("auto" serves FP32 checkpoints in 16 bits)."""
    dtype = str(dtype or "auto")
    if dtype in ("float32", "float"):
        return 4, "F32"
    if dtype in ("bfloat16", "float16", "half"):
        return 2, "BF16" if dtype == "bfloat16" else "F16"
    return 2, checkpoint if checkpoint in ("BF16", "F16") else "F16"


def _weights(dep: Any, path: Path, info: WeightsInfo) -> _Weights:
    """What the deployment's weights will occupy: exact from the files that will be loaded when they exist,
    else an estimate from the architecture (labelled), else unknown."""
    from evalkit.engines import engine_spec
    from evalkit.models import FP8_WEIGHT_VARIANT, HF_VARIANT, NATIVE_FP8_VARIANT

    source, variant, arch = dep.model.source, dep.model.variant, info.arch
    spec = engine_spec(dep.engine)
    dtype, quant = spec.dtype_of(dep.options), str(spec.quantization_of(dep.options) or "")
    notes: tuple[str, ...] = (info.note,) if info.note else ()

    fmt = _quant_format(variant, path)
    if fmt is not None:  # GPTQ / AWQ / INT8 W8A8: a variant by name, or a pre-quantized checkpoint
        if variant is None and info.weights_bytes is not None:
            return _Weights(info.weights_bytes, fmt.name, info.source, notes=notes)
        return _Weights(quant_weight_bytes(arch, fmt), fmt.name, _quant_source(arch, fmt, variant), True, notes)
    if variant is not None and not (variant == HF_VARIANT and path.is_dir()):
        built = _built_variant(source, path, variant)
        if built is not None:
            made = hf_weights(built) if built.is_dir() else gguf_weights(built)
            if made.weights_bytes is not None:
                if built.is_dir():
                    per, prec = _dtype_bytes(dtype, made.precision)
                    size = made.weights_bytes if per == DTYPE_BYTES.get(made.precision.split("/")[0], 2) else made.arch.n_params * per
                    prec = "BF16 (FP8-rounded values)" if variant == FP8_WEIGHT_VARIANT else prec
                    if variant == NATIVE_FP8_VARIANT and made.non_embedding_bytes:  # linear layers: 1 byte per weight at load
                        src = DTYPE_BYTES.get(made.precision.split("/")[0], 2)
                        size = made.non_embedding_bytes // src + (made.weights_bytes - made.non_embedding_bytes) * per // src
                        prec = "FP8 W8A8 linear layers"
                    return _Weights(size, prec, f"{made.source} (prepared {variant})", notes=notes)
                return _Weights(made.weights_bytes, variant, f"gguf tensors (prepared {variant})", notes=notes)
        if variant in GGUF_BPW:
            if not path.is_dir() and info.precision.upper() == variant.upper():
                return _Weights(info.weights_bytes, variant, info.source, notes=notes)
            if path.is_dir():
                notes += (f"evalkit prepares {variant} from a GGUF source only (convert this checkpoint to GGUF first)",)
            size = arch_weight_bytes(arch, variant)
            return _Weights(size, variant, f"estimate: {arch.n_params:,} parameters x {GGUF_BPW[variant]} bits ({variant} mix, not built yet)", True, notes)
        if variant == NATIVE_FP8_VARIANT:
            return _Weights(arch_weight_bytes(arch, "FP8"), "FP8 W8A8 linear layers", f"estimate: {arch.n_params:,} parameters, linear layers x 1 byte, embeddings x 2 (fp8 variant, not built yet)", True, notes)
        if variant in (HF_VARIANT, FP8_WEIGHT_VARIANT):
            # Both variants are 16-bit checkpoints (fp8-weight only rounds values through FP8; storage stays 16-bit).
            per, prec = _dtype_bytes(dtype, "BF16")
            prec = "BF16 (FP8-rounded values)" if variant == FP8_WEIGHT_VARIANT else prec
            return _Weights(arch.n_params * per, prec, f"estimate: {arch.n_params:,} parameters x {per} bytes ({variant} variant, not built yet)", True, notes)
        return _Weights(None, variant, "unknown", notes=notes + (f"no size model for variant {variant!r}",))
    if not path.is_dir():
        return _Weights(info.weights_bytes, info.precision, info.source, notes=notes)
    if quant.startswith("fp8"):
        # FP8 quantizes Linear layers only: embeddings and lm_head stay 16-bit. (What loading the 16-bit
        # checkpoint first costs is the engine's memory model's note.)
        if info.weights_bytes is not None and info.non_embedding_bytes:
            per = max(DTYPE_BYTES.get(info.precision.split("/")[0], 2), 1)
            size = info.non_embedding_bytes // per + (info.weights_bytes - info.non_embedding_bytes) * 2 // per
            return _Weights(size, ONLINE_FP8, "safetensors", notes=notes)
        return _Weights(arch_weight_bytes(arch, "FP8"), ONLINE_FP8, f"estimate: {arch.n_params:,} parameters, linear layers x 1 byte, embeddings x 2 (config.json)", True, notes)
    per, prec = _dtype_bytes(dtype, info.precision.split("/")[0])
    if info.weights_bytes is not None and per == DTYPE_BYTES.get(info.precision.split("/")[0], 2):
        return _Weights(info.weights_bytes, prec, info.source, notes=notes)
    if info.weights_bytes is not None:  # served in another width than stored: the count is exact, the bytes follow
        return _Weights(arch.n_params * per, prec, f"{info.source}: parameters x {per} bytes", notes=notes)
    return _Weights(arch.n_params * per, prec, f"estimate: {arch.n_params:,} parameters (config.json) x {per} bytes", True, notes)


def _quant_format(variant: str | None, path: Path) -> Any:
    """The GPTQ/AWQ/INT8 format of a variant name, or of a checkpoint directory's quantization_config."""
    from evalkit.quant_formats import from_hf_config, looks_like_format, parse

    if variant is not None:
        return parse(variant) if looks_like_format(variant) else None
    if path.is_dir() and (path / "config.json").is_file():
        try:
            return from_hf_config(json.loads((path / "config.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
    return None


def quant_weight_bytes(arch: ArchSpec, fmt: Any) -> int:
    """A model's weights in a GPTQ/AWQ/INT8 format (evalkit.quant_formats.weight_bytes: linear layers at the
    format's bytes per weight with scales and zero points, the rest 16-bit)."""
    from evalkit.quant_formats import weight_bytes

    return weight_bytes(arch, fmt)


def _quant_source(arch: ArchSpec, fmt: Any, variant: str | None) -> str:
    per = fmt.linear_bytes_per_weight(arch.hidden)
    what = f"{variant} variant, not built yet" if variant else "config.json"
    return (f"estimate: {arch.n_params:,} parameters; linear layers x {per:.4f} bytes ({fmt.describe()}), "
            f"embeddings, head and norms x 2 ({what})")


def _compute_width(dep: Any, config_file: Path, hw: Hardware, w: _Weights) -> tuple[_Weights, str | None]:
    """Where the named GPU's rules (EngineSpec.plan_precision) say the engine computes a 16-bit checkpoint in a
    wider dtype (vLLM's "auto" gives Gemma float32 on GPUs without bf16), the weights sized in that dtype and the
    dtype the engine's memory model must size activations and KV in; else (w, None)."""
    from evalkit.engines import engine_spec

    spec = engine_spec(dep.engine)
    if hw.gpu is None or spec.plan_precision is None or spec.dtype_option is None or w.bytes is None:
        return w, None
    stored = DTYPE_BYTES.get(w.precision.upper())
    if stored != 2:  # only plain 16-bit weights ("BF16", "F16"): quantized formats and "X as Y" are sized already
        return w, None
    verdict = spec.plan_precision(dep, model_facts(dep, config_file), hw.gpu, hw, version=hw.versions.get(dep.engine))
    real = {"float32": 4}.get(verdict.dtype or "")
    if verdict.refused or real is None:
        return w, None
    n = w.bytes // stored
    return replace(w, bytes=n * real, precision=f"{w.precision} as {verdict.dtype}",
                   source=f"{w.source}; {n:,} parameters x {real} bytes: {verdict.engine_version} computes in {verdict.dtype} "
                          f"on {hw.gpu.name}"), verdict.dtype


def deployment_row(dep: Any, config_file: Path, hw: Hardware, workload: Workload | None = None) -> LedgerRow:
    """One deployment's ledger row: exact from the files to be loaded, an estimate from the architecture when
    they do not exist yet (labelled), unknown (fits: None) when neither can be known. A served model with no
    weights named (`model:` omitted) is held by its server: a row "on the server", its memory unknown here."""
    budget = hw.gpu_memory_bytes if hw.gpus else hw.ram_bytes
    if dep.model is None:
        return LedgerRow(dep.name, dep.engine, "?", "unknown", SERVER_DEVICES, 0, None, None, None, None, None, None,
                         budget, fits=None, max_context=None, memory_context=None, max_concurrency=None,
                         notes="served model, weights not named: its memory is the server's, unknown here")
    source, variant, engine = dep.model.source, dep.model.variant, dep.engine
    path = local_model_path(source, config_file)
    info: WeightsInfo | None = None
    problem = f"model {source!r} not found (no file, installed package or Hugging Face cache entry)"
    if path is not None:
        try:
            info = hf_weights(path) if path.is_dir() else gguf_weights(path)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:  # a corrupt file is a row, not a crash
            problem = f"cannot read {path}: {e}"
    predict = _memory_model(engine)
    if path is None or info is None or predict is None:
        reason = problem if info is None else f"no memory model for engine {engine!r}"
        return LedgerRow(dep.name, engine, variant or "?", "unknown", hw.describe(), 0, None, None, None, None, None, None,
                         budget, fits=None, max_context=None, memory_context=None, max_concurrency=None,
                         notes=f"size unknown: {reason}")
    w = _weights(dep, path, info)
    w, wider = _compute_width(dep, Path(config_file), hw, w)
    options = dep.options
    if wider is not None and hasattr(options, "model_copy"):  # activations and KV in the compute dtype too
        options = options.model_copy(update={engine_spec_dtype_option(engine): wider})
    row = predict(dep.name, info.arch, w.bytes or 0, w.precision, w.source, options, hw, workload=workload)
    notes = "; ".join([*w.notes, row.notes] if row.notes else w.notes)
    if w.bytes is None:
        return _unknown_weights(replace(row, notes=notes), "; ".join(w.notes) or "no size for these files")
    return replace(row, estimate=w.estimate, notes=notes)


def engine_spec_dtype_option(engine: str) -> str:
    from evalkit.engines import engine_spec

    return str(engine_spec(engine).dtype_option)


def ledger_table(config: Any, config_file: Path) -> list[LedgerRow]:
    hw, workload = hardware_from_config(config), workload_of(config)
    return [deployment_row(dep, Path(config_file), hw, workload) for dep in config.deployments]


def _gb(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GB:.2f}"


def format_ledger(rows: list[LedgerRow]) -> str:
    """A plain-text table (GB = 10^9 bytes) with each row's notes below it; estimates are marked with ~."""
    head = ["deployment", "engine", "precision", "weights GB", "KV B/token", "KV GB", "overhead GB", "per device GB", "budget GB", "fits", "max ctx", "max conc"]
    body = [
        [r.deployment, r.engine, r.precision, ("~" if r.estimate else "") + _gb(r.weights_bytes),
         "unknown" if r.kv_bytes_per_token is None else f"{r.kv_bytes_per_token:,}", _gb(r.kv_bytes),
         _gb(r.overhead_bytes), ("~" if r.estimate else "") + _gb(r.per_device_bytes), f"{_gb(r.device_budget_bytes)} ({r.devices})",
         {True: "yes", False: "NO", None: "unknown"}[r.fits], "-" if r.max_context is None else f"{r.max_context:,}",
         "-" if r.max_concurrency is None else str(r.max_concurrency)]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]

    def line(cells: list[Any]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [line(head), line(["-" * w for w in widths])]
    for r, cells in zip(rows, body):
        out.append(line(cells))
        out.append(f"    weights: {r.weights_from}" + (f"; {r.notes}" if r.notes else ""))
    if any(r.estimate for r in rows):
        out.append("~ estimate: the weights' files do not exist yet; sized from the architecture and the precision")
    from dataclasses import asdict

    unfit = unfit_line([asdict(r) for r in rows])
    if unfit:
        out.append(unfit[0].upper() + unfit[1:] + "; `evalkit run` refuses it")
    out.append("GB = 10^9 bytes")
    return "\n".join(out)


def unfit_line(rows: list[dict[str, Any]]) -> str | None:
    """One line with each deployment the plan says this machine cannot hold (`fits` false), its figures and why;
    None when every one fits or is unknown. Rows as the manifest stores them (LedgerRow fields)."""

    def gb(n: float | None) -> str:
        return "?" if n is None else f"{n / GB:.2f}"

    parts = []
    for r in rows:
        if r.get("fits") is not False:
            continue
        kv = r.get("kv_given_bytes") or r.get("kv_bytes")
        figures = (f"{r['deployment']} needs {gb(r.get('per_device_bytes'))} GB per device (weights {gb(r.get('weights_bytes'))}, "
                   f"KV cache {gb(kv)}, overhead {gb(r.get('overhead_bytes'))}) of {r.get('devices')}")
        why = [n.strip() for n in str(r.get("notes", "")).split(";") if "refuses" in n or "GPU(s)" in n]
        parts.append(figures + (f": {why[0]}" if why else ""))
    if not parts:
        return None
    return "by the memory plan this machine cannot hold: " + "; ".join(parts) + " (details: `evalkit plan`)"
