"""Hardware truth at plan time: for the GPU a config names (`hardware: {gpu: ...}`), what each deployment will
really compute with, from its engine's rules (EngineSpec.plan_precision; vLLM's are in
evalkit/engines/vllm_rules.py with the vLLM source of each rule), before anything is downloaded or loaded.

`evalkit plan` prints one line per deployment below the memory table; a deployment its engine refuses on that
GPU is a one-line plan error (exit 2), with the others still shown.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.errors import ConfigError
from evalkit.gpus import GpuModel, GpuVerdict
from evalkit.weights import model_facts


def verdicts(config: Any, config_file: Path, rows: list[Any] | None = None) -> tuple[GpuModel | None, list[GpuVerdict]]:
    """The named GPU and every deployment's verdict on it ([] when the config names no GPU or capability)."""
    from evalkit.ledger import hardware_from_config

    spec = getattr(config, "hardware", None)
    gpu = spec.gpu_model() if spec is not None and hasattr(spec, "gpu_model") else None
    if gpu is None or spec is None or not spec.gpu_count():
        return None, []
    return gpu, verdicts_on(config, config_file, gpu, hardware_from_config(config), rows)


def verdicts_on(config: Any, config_file: Path, gpu: GpuModel, hw: Any, rows: list[Any] | None = None) -> list[GpuVerdict]:
    """Every deployment's verdict on `gpu` (hw: the ledger's Hardware, for placement and one-card fits)."""
    from evalkit.engines import engine_spec

    weights = {r.deployment: r.weights_bytes for r in rows or []}
    out = []
    for dep in config.deployments:
        rules = getattr(engine_spec(dep.engine), "plan_precision", None)
        if rules is None:
            out.append(GpuVerdict(dep.name, dep.engine, gpu.name, "no GPU rules declared for this engine", None, "unknown"))
            continue
        # The engine release the target runs (`hardware: {engine_versions: {<engine>: ...}}`), else the rules' own default (installed).
        version = (getattr(hw, "versions", None) or {}).get(dep.engine)
        verdict = rules(dep, model_facts(dep, config_file, weights.get(dep.name)), gpu, hw, version=version)
        row = next((r for r in rows or [] if r.deployment == dep.name), None)
        out.append(_with_width_note(verdict, row))
    return out


_WIDTH = {"float32": 4, "float16": 2, "bfloat16": 2}
_ROW_WIDTH = {"F32": 4, "F16": 2, "BF16": 2}


def _with_width_note(verdict: GpuVerdict, row: Any) -> GpuVerdict:
    """Where the engine will compute in a wider dtype than the memory plan's 16-bit weights (vLLM's "auto" gives
    Gemma float32 on GPUs without bf16), say that the plan's weights are too small by that factor."""
    precision = str(getattr(row, "precision", ""))
    # "BF16 as float32": the engine's memory model already sized the weights in the dtype after "as"
    planned = _WIDTH.get(precision.rsplit(" as ", 1)[1]) if " as " in precision else _ROW_WIDTH.get(precision.split(" ")[0])
    real = _WIDTH.get(verdict.dtype or "")
    if verdict.refused or planned is None or real is None or real <= planned:
        return verdict
    from dataclasses import replace

    note = (f"the memory plan sized the weights at {planned} bytes per parameter ({row.precision}); computing in "
            f"{verdict.dtype} holds {real // planned}x that")
    return replace(verdict, notes=(*verdict.notes, note))


def detected_gpu() -> tuple[GpuModel | None, int]:
    """This machine's GPU as a GpuModel (the table's entry for NVML's name when it has one; the lowest capability
    when GPUs differ) and how many there are; (None, 0) without a CUDA GPU."""
    from evalkit.gpus import lookup
    from evalkit.hardware import detect_accelerators

    accs = [(a, a.capability) for a in detect_accelerators() if a.capability is not None]
    if not accs:
        return None, 0
    a, cap = min(accs, key=lambda pair: pair[1])
    known = lookup(a.name)
    if known is not None and known.capability == cap:
        return known, len(accs)
    memory = (a.memory_bytes or 0) / 1e9
    return GpuModel(a.name, round(memory, 1), cap, None, cap >= (8, 9), cap >= (8, 0), source="detected"), len(accs)


def _this_machine(gpu: GpuModel, n: int) -> Any:
    """The ledger's Hardware for this machine with its GPU model: NVML's memory when pynvml is there, else the
    detected (or table) figure."""
    from dataclasses import replace

    from evalkit.ledger import detect_hardware

    base = detect_hardware()
    return replace(base, gpus=n, gpu=gpu, gpu_memory_bytes=base.gpu_memory_bytes if base.gpus else int(gpu.memory_gb * 1e9))


def doctor_section(config: Any, config_file: Path) -> str:
    """`evalkit doctor --config`: what each deployment would compute with on this machine's GPU."""
    gpu, n = detected_gpu()
    if gpu is None:
        named = getattr(getattr(config, "hardware", None), "gpu", None)
        return ("Deployments: no CUDA GPU here, so no GPU rules apply on this machine"
                + (f"; `evalkit plan` applies them to the config's {named}" if named else
                   "; name one in the config (hardware: {gpu: ...}) and `evalkit plan` applies them"))
    return format_verdicts(gpu, verdicts_on(config, config_file, gpu, _this_machine(gpu, n)), n)


def format_verdicts(gpu: GpuModel, found: list[GpuVerdict], n_gpus: int) -> str:
    lines = [f"On {n_gpus}x {gpu.describe()}:"]
    for v in found:
        version = f" [{v.engine_version}]" if v.engine_version else ""
        lines.append(f"  {v.deployment}: {'REFUSED' if v.refused else v.summary}{version}")
        if v.refused:
            lines.append(f"      {v.refused}")
        lines += [f"      {n}" for n in v.notes]
    return "\n".join(lines)


def refusals(found: list[GpuVerdict], config_file: Path) -> list[ConfigError]:
    """One error per deployment its engine will not start on the named GPU."""
    return [ConfigError(str(config_file), f"deployment {v.deployment} cannot run on {v.gpu}: {v.refused.split(' [')[0]}"
                        + (f" [{v.engine_version}]" if v.engine_version else ""))
            for v in found if v.refused]


def refusals_here(config: Any, config_file: Path) -> list[ConfigError]:
    """`run`'s check before anything is written: the deployments their engine would refuse on this machine's GPU
    (none on a machine without one: engines then run on the CPU, where these rules do not apply)."""
    gpu, n = detected_gpu()
    if gpu is None:
        return []
    return refusals(verdicts_on(config, config_file, gpu, _this_machine(gpu, n)), config_file)

