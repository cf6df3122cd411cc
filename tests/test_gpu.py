"""GPU-only checks (marker `gpu`: outside make test and CI's selection; benchmarks/gpu/run_on_device.sh runs
them on the device with EVALKIT_GPU_HF, a SmolLM2-shaped checkpoint, and EVALKIT_GPU_GGUF, a GGUF of it).

- the hf engine's CUDA-graph decode gives the tokens and log-probs of its eager decode (same shapes, same
  kernels: only the launches differ), at batch 1 and 4;
- its compiled decode (torch.compile + CUDA graphs, the default on a GPU) is as close to a float32 decode of
  the same tokens as the eager bf16 decode is, and generate() through it stops and counts as the eager one;
- the fp8 variant computes natively (Fp8Linear on the GPU) and stays close to bf16 on the same weights;
- llama.cpp offloads every layer with n_gpu_layers auto;
- what a CUDA context costs (NVML, printed; first, before any other test made one): the ledger's
  CUDA_CONTEXT_BYTES is calibrated from it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evalkit.engines.base import GenRequest, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.engine]


def _path(var: str) -> str:
    p = os.environ.get(var)
    if not p or not Path(p).exists():
        pytest.fail(f"{var} must name the model the device script made (got {p!r})")
    return p


def _nvml_used() -> int:
    import pynvml

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


def _decode(engine: Any, prompts: list[list[int]], n: int) -> tuple[list[list[int]], np.ndarray]:
    import torch

    rows: list[np.ndarray] = []
    reqs = [(GenRequest(key=str(i), prompt="", chat=False, ignore_eos=True), p, n) for i, p in enumerate(prompts)]
    res = list(engine._decode_batch(reqs, SamplingParams(temperature=0.0, max_tokens=n), 0.0,
                                    on_logits=lambda k, lg: rows.append(torch.log_softmax(lg.double(), -1).float().cpu().numpy())))
    return [r.output_token_ids for r in res], np.stack(rows)


def test_cuda_context_cost_printed() -> None:
    import torch

    before = _nvml_used()
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    after = _nvml_used()
    print(f"\ntorch CUDA context + cuBLAS handle: NVML used grew {(after - before) / 1e9:.3f} GB "
          f"(tensors {torch.cuda.memory_allocated() / 1e9:.3f} GB, reserved {torch.cuda.memory_reserved() / 1e9:.3f} GB)")
    assert after > before


def test_cuda_graph_decode_equals_eager_decode() -> None:
    from evalkit.engines.hf import HfEngine, HfOptions

    path = _path("EVALKIT_GPU_HF")
    graphed = HfEngine(path, HfOptions(dtype="bfloat16", max_length=1024, torch_compile="off"))
    eager = HfEngine(path, HfOptions(dtype="bfloat16", max_length=1024, cuda_graphs=False, torch_compile="off"))
    prompts = [graphed.tokenize(t, add_bos=True) for t in ("The capital of France is", "Once upon a time, in a land far", "x")]
    for batch in (prompts[:1], prompts):
        a_tok, a_lp = _decode(graphed, batch, 24)
        b_tok, b_lp = _decode(eager, batch, 24)
        assert graphed.info().extra["cuda_graphs"] is True, graphed.info().extra.get("cuda_graph_error")
        assert a_tok == b_tok
        np.testing.assert_allclose(a_lp, b_lp, atol=1e-3)


def _forced(engine: Any, prompts: list[list[int]], path: list[list[int]]) -> np.ndarray:
    """Log-softmax rows (steps, rows, vocab) of a batch decoded along given tokens (fed, not picked): the
    prefill's row, then one per decode step, so engines of different numerics see the same inputs."""
    import torch

    n, width = len(prompts), max(map(len, prompts))
    step = engine._stepper(n, -(-(width + len(path[0]) + 1) // 128) * 128)
    ids = torch.tensor([[engine._pad] * (width - len(p)) + p for p in prompts], device=engine._device)
    pads = torch.tensor([width - len(p) for p in prompts], device=engine._device)
    rows = [step.prefill(ids, pads, width).double().log_softmax(-1)]
    for t in range(len(path[0])):
        step.feed([row[t] for row in path])
        rows.append(step.step().double().log_softmax(-1))
    return torch.stack(rows).float().cpu().numpy()


def test_compiled_decode_is_as_close_to_float32_as_eager() -> None:
    from evalkit.engines.hf import HfEngine, HfOptions

    path = _path("EVALKIT_GPU_HF")
    compiled = HfEngine(path, HfOptions(dtype="bfloat16", max_length=1024))  # the default: compiled + graphs
    eager = HfEngine(path, HfOptions(dtype="bfloat16", max_length=1024, cuda_graphs=False, torch_compile="off"))
    f32 = HfEngine(path, HfOptions(dtype="float32", max_length=1024, cuda_graphs=False, torch_compile="off"))
    prompts = [compiled.tokenize(t, add_bos=True) for t in ("The capital of France is", "Once upon a time, in a land far", "x")]
    tokens, _ = _decode(eager, prompts, 24)
    for batch, toks in ((prompts[:1], tokens[:1]), (prompts, tokens)):
        want = _forced(f32, batch, toks)
        err_compiled = float(np.abs(_forced(compiled, batch, toks) - want).max())
        err_eager = float(np.abs(_forced(eager, batch, toks) - want).max())
        print(f"\nbatch {len(batch)}: max |log-prob - float32|: compiled {err_compiled:.2e}, eager {err_eager:.2e}")
        assert 0 < err_compiled <= 2 * err_eager
    stats = compiled.run_stats()
    assert stats["decode_compiled"] is True and stats["cuda_graphs"] is True, stats
    # generate() runs one step ahead of its reading: its tokens are the argmax of the step that fed each one
    out, _ = _decode(compiled, prompts, 20)
    picked = _forced(compiled, prompts, [t[:-1] for t in out]).argmax(-1)  # same shapes and kernels: exact
    assert [list(map(int, col)) for col in picked.T] == out


def test_fp8_variant_is_native_and_close_to_bf16(tmp_path: Path) -> None:
    import torch

    from evalkit.engines.hf import HfEngine, HfOptions
    from evalkit.engines.hf_fp8 import Fp8Linear

    from evalkit.variants import prepare_variant

    path = _path("EVALKIT_GPU_HF")
    fp8_dir = prepare_variant(str(Path(path).resolve()), "fp8", progress=False)  # the variant a run would load
    fp8 = HfEngine(str(fp8_dir), HfOptions(dtype="bfloat16", max_length=1024))
    bf16 = HfEngine(path, HfOptions(dtype="bfloat16", max_length=1024))
    assert sum(isinstance(m, Fp8Linear) for m in fp8._model.modules()) == fp8._fp8_layers > 0
    assert "native W8A8" in fp8.info().extra["fp8"] and torch.cuda.get_device_capability() >= (8, 9)
    ids = bf16.tokenize("The quick brown fox jumps over the lazy dog. " * 8, add_bos=True)
    p = np.concatenate([b for _, b in bf16.token_distributions(ids, 1)]).astype(np.float64)
    q = np.concatenate([b for _, b in fp8.token_distributions(ids, 1)]).astype(np.float64)
    kld = float(np.mean(np.sum(np.exp(p) * (p - q), axis=1)))
    print(f"\nKLD(bf16 || fp8) on {len(ids) - 1} positions: {kld:.3e}")
    assert 0 < kld < 0.05


def test_llamacpp_auto_offloads_every_layer() -> None:
    # torch (CUDA) is loaded in this process by the hf tests before: the load order that crashed on the H200.
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
    from evalkit.engines.llamacpp_lib import load_llama_cpp

    llama_cpp = load_llama_cpp()

    assert llama_cpp.llama_supports_gpu_offload()
    before = _nvml_used()
    eng = LlamaCppEngine(_path("EVALKIT_GPU_GGUF"), LlamaCppOptions(n_ctx=1024))
    try:
        info = eng.info().extra
        assert info["n_gpu_layers"] == -1 and info["offload"] == "every layer on the GPU"
        out = list(eng.generate([GenRequest(key="a", prompt="Hello", chat=False, max_tokens=8, ignore_eos=True)],
                                SamplingParams(max_tokens=8)))[0]
        assert len(out.output_token_ids) == 8
        print(f"\nllama.cpp: NVML used grew {(_nvml_used() - before) / 1e9:.3f} GB for {Path(_path('EVALKIT_GPU_GGUF')).stat().st_size / 1e9:.3f} GB of GGUF at n_ctx 1024")
    finally:
        eng.close()
