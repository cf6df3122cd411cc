"""The hf engine's native-FP8 linear layer (engines/hf_fp8.py), checked on the CPU against an independent
float64 computation of what W8A8 with per-channel weight scales and per-token activation scales means.
(torch's CPU `_scaled_mm` emulates FP8: the numbers are the same ones FP8 tensor cores give, up to the
accumulation order; the engine still refuses the variant without FP8 tensor cores.)"""
from __future__ import annotations

import pytest

from conftest import require_module


def _e4m3(x):  # round to the nearest float8 E4M3 value (torch's cast: round to nearest even, saturating here)
    import torch

    return x.clamp(-448, 448).to(torch.float8_e4m3fn).double()


def test_fp8_linear_is_w8a8_with_row_scales() -> None:
    torch = require_module("torch")
    from evalkit.engines.hf_fp8 import Fp8Linear, native_fp8

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g) * torch.logspace(-2, 1, 48)[:, None])  # rows of different scales
        lin.bias.copy_(torch.randn(48, generator=g))
    x = torch.randn(2, 5, 64, generator=g) * torch.logspace(-3, 2, 5)[None, :, None]  # tokens of different scales
    fp8 = Fp8Linear(lin.to(torch.bfloat16))
    got = fp8(x.to(torch.bfloat16)).double()

    w = lin.weight.detach().to(torch.bfloat16).double()
    sw = w.abs().amax(dim=1, keepdim=True) / 448
    xs = x.to(torch.bfloat16).double().reshape(-1, 64)
    sx = xs.abs().amax(dim=1, keepdim=True) / 448
    want = ((_e4m3(xs / sx) * sx) @ (_e4m3(w / sw) * sw).T + lin.bias.detach().to(torch.bfloat16).double()).reshape(2, 5, 48)
    assert fp8.qweight.dtype == torch.float8_e4m3fn and fp8.wscale.shape == (1, 48)
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-3 * want.abs().max().item())  # bf16 output rounding
    exact = (xs @ w.T + lin.bias.detach().double()).reshape(2, 5, 48)
    rel = ((got - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 0.08  # FP8 is really in play (E4M3 has 3 mantissa bits), and not wrong
    assert native_fp8((9, 0)) and native_fp8((8, 9)) and not native_fp8((8, 6)) and not native_fp8(None)


def test_quantize_linears_skips_the_output_head() -> None:
    torch = require_module("torch")
    transformers = require_module("transformers")
    from evalkit.engines.hf_fp8 import Fp8Linear, quantize_linears

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    n = quantize_linears(model)
    assert n == 2 * 7  # q k v o gate up down per layer
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear) and not isinstance(model.get_output_embeddings(), Fp8Linear)
    assert sum(isinstance(m, Fp8Linear) for m in model.modules()) == n
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 3, 100) and torch.isfinite(out).all()
