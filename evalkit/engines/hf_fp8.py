"""Native FP8 for the hf engine (the `fp8` variant): W8A8 through `torch._scaled_mm` on FP8 tensor cores.

Every decoder nn.Linear except the output head (what vLLM's fp8 quantizes too) is replaced at load by an
`Fp8Linear`: the weight rounded once to float8 E4M3 with one float32 scale per output channel
(amax / 448, as vLLM's online per-channel FP8), and at every call the activations rounded to E4M3 with one
dynamic scale per token (row); the product runs in FP8 with float32 accumulation and both scales applied
in the epilogue (`torch._scaled_mm` with row-wise scales, out_dtype = the model's 16-bit dtype).

Why `torch._scaled_mm` directly and not a library: torchao's float8 inference and transformers'
`FineGrainedFP8Config` do the same thing, but the latter fetches its kernel from a hub at run time (unusable
offline) and torchao is one more large dependency for ~40 lines; `_scaled_mm` is the op they both call.
The engine refuses the variant on devices without FP8 tensor cores (compute capability < 8.9, or CPU):
torch's CPU `_scaled_mm` emulates FP8, which is not what the label promises (engines/hf_rules.py says the
same at plan time). Imported only when such a variant loads.
"""
from __future__ import annotations

from typing import Any

import torch

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # an all-zero row or token: any positive scale gives zeros


class Fp8Linear(torch.nn.Module):
    """y = (round_e4m3(x / s_x) @ round_e4m3(W / s_w)^T) * s_x * s_w (+ bias), per-token s_x, per-channel s_w."""

    qweight: torch.Tensor  # buffers (register_buffer): the FP8 weight (out, in) and its scales (1, out)
    wscale: torch.Tensor

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scale = (w.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)  # (out, 1)
        self.register_buffer("qweight", (w.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn))
        self.register_buffer("wscale", scale.t().contiguous())  # (1, out): _scaled_mm's scale_b
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.out_dtype = w.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        sx = (x2.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)  # (tokens, 1)
        xq = (x2.float() / sx).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        # qweight is (out, in) row-major, so .t() is the column-major (in, out) operand _scaled_mm wants.
        y = torch._scaled_mm(xq, self.qweight.t(), scale_a=sx, scale_b=self.wscale, out_dtype=self.out_dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3 w8a8 per-channel/per-token"


def quantize_linears(model: Any) -> int:
    """Replace every nn.Linear of `model` except its output head by an Fp8Linear, in place; the count.

    Module by module, so at most one 16-bit weight is duplicated at a time."""
    head = model.get_output_embeddings()
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, Fp8Linear(module))
        del module
    return len(targets)


def native_fp8(capability: tuple[int, int] | None) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) or later (engines/hf_rules.py cites torch's own gate)."""
    return capability is not None and capability >= (8, 9)
