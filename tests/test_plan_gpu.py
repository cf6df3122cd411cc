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


def test_field_comparison_on_v100s(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _plan(capsys, FIELD)
    assert rc == 2  # a deployment that cannot run on the named GPU is a plan error
    assert "On 2x V100-SXM2-16GB (compute capability 7.0, 16 GB" in out
    s = _section(out)
    assert set(s) == {"vllm-fp16", "vllm-fp8", "llamacpp-q4km"}
    assert "computes in float16" in s["vllm-fp16"].splitlines()[0]
    fp8 = s["vllm-fp8"]
    assert "REFUSED" in fp8.splitlines()[0]
    assert "fp8 is not supported for the current GPU (minimum capability 7.5, this GPU 7.0" in fp8
    assert "vllm/model_executor/layers/quantization/fp8.py" in fp8  # the rule cites vLLM's source
    assert "falls back to float16" in fp8  # the bf16 checkpoint under dtype auto
    assert "vLLM 0.6.3-0.13.0: refused" in fp8 and "minimum capability 8.0" in fp8  # 0.6.3 had no 16-bit fallback on 7.0
    q4 = s["llamacpp-q4km"]
    assert "CUDA backend, 29/29 layers offloaded to 2 GPUs" in q4
    assert "fits on one card" in q4 and "does not fit" not in q4
    errors = err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"evalkit: error: {FIELD}: deployment vllm-fp8 cannot run on V100-SXM2-16GB:")
    # The memory plan is printed as well: every deployment fits the two cards (FP16 only with TP=2).
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("vllm-", "llamacpp-"))}
    assert all(" yes " in rows[n] for n in ("vllm-fp16", "vllm-fp8", "llamacpp-q4km"))


def test_field_comparison_on_h100s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(FIELD.read_text())
    config["hardware"]["gpu"] = "H100-SXM-80GB"
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
    assert v["quantization"] == "refused" and "minimum capability 7.5" in v["refused"] and v["gpu"] == "V100-SXM2-16GB"
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


def test_wider_compute_dtype_than_planned_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 on a V100 with dtype auto: vLLM computes in float32 (no bf16, float16 refused for the family), so the
    memory plan's bf16 weights are half of what it will hold; the plan says so."""
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
    assert rc == 0 and "computes in float32" in s["auto"] and "holds 2x that" in s["auto"]
    assert "On 1x V100-PCIE-32GB" in out


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
