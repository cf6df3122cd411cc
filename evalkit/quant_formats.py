"""Weight-quantization formats people choose between on GPUs: GPTQ and AWQ (integer weights, 16-bit compute) and
INT8 W8A8 (integer weights and activations): what a format name or a checkpoint's `quantization_config` means,
and how many bytes each weight takes with its scales and zero points.

Names (variants and plan): `gptq-w<bits>[g<group>]` (no group: one scale per output channel), `awq-w4g<group>`,
`w8a8-int8`. A checkpoint's config.json says the same in its `quantization_config` (`quant_method` gptq, awq or
compressed-tensors). Engine-agnostic: which bits and group sizes an engine's kernels take is the engine's
(`EngineSpec.format_problem`, asked through the registry), and what it does with each format on each GPU is its
plan rules (evalkit/engines/).

Bytes per weight, as the checkpoint stores them (an engine's loader allocates the same tensors): GPTQ and AWQ
pack `bits` per weight into int32 (`qweight`), keep one 16-bit scale per group and output column (`scales`) and
one packed `bits`-wide zero point per group and column (`qzeros`, symmetric GPTQ too); compressed-tensors
W4A16/W8A16 (`weight_packed`, `weight_scale`) store zero points only when asymmetric; INT8 W8A8 is one byte per
weight plus one scale per output channel. Embeddings, the output head, norms and biases stay in the
checkpoint's 16-bit dtype (linear layers only are quantized).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QuantFormat:
    """One weight-quantization format."""

    name: str  # evalkit's name: gptq-w4g128, gptq-w8, awq-w4g128, w8a8-int8
    method: str  # "gptq" | "awq" | "w8a8-int8" | "wna16" (a compressed-tensors weight-only checkpoint)
    bits: int  # weight bits
    group_size: int  # weights sharing one scale along the input dimension; -1: one per output channel
    zero_points: bool  # stored per-group zero points used by the kernel (AWQ); symmetric GPTQ uses a fixed bias
    checkpoint: str  # how it is written: "gptq" (quantize_config), "awq", or "compressed-tensors"
    act_bits: int = 16  # activations: 16 (weight-only) or 8 (W8A8)
    desc_act: bool = False  # GPTQ act-order (a g_idx permutation per layer)

    @property
    def weight_only(self) -> bool:
        return self.act_bits == 16

    def describe(self) -> str:
        group = "per output channel" if self.group_size == -1 else f"group size {self.group_size}"
        if self.method == "w8a8-int8":
            return "INT8 weights (per channel) and INT8 activations (per token, dynamic), W8A8"
        what = "INT" if self.method == "wna16" else f"{self.method.upper()} "
        return f"{what}{self.bits}-bit weights, {group}, 16-bit activations (W{self.bits}A16, {self.checkpoint} checkpoint)"

    def linear_bytes_per_weight(self, in_features: int, scale_bytes: int = 2) -> float:
        """Bytes per weight of a quantized linear layer with `in_features` inputs (the group count depends on it
        only for per-channel formats), scales and zero points included."""
        groups_per_weight = 1 / in_features if self.group_size == -1 else 1 / self.group_size
        if self.method == "w8a8-int8":  # int8 weight + one float32 scale per output channel
            return 1 + 4 / in_features
        stores_zeros = self.checkpoint in ("gptq", "awq") or self.zero_points
        zeros = self.bits / 8 * groups_per_weight if stores_zeros else 0.0
        return self.bits / 8 + scale_bytes * groups_per_weight + zeros


def linear_shapes(arch: Any) -> list[tuple[int, int, int]]:
    """(in_features, out_features, count) of a gated-MLP decoder's linear layers: q, k, v, o and gate, up, down
    in each of arch.n_layers layers (the layers these formats quantize)."""
    q, kv = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
    n = arch.n_layers
    return [(arch.hidden, q, n), (arch.hidden, kv, 2 * n), (q, arch.hidden, n),
            (arch.hidden, arch.intermediate, 2 * n), (arch.intermediate, arch.hidden, n)]


def weight_bytes(arch: Any, fmt: QuantFormat, other_bytes: int = 2) -> int:
    """The model's weights in `fmt`: the linear layers at the format's bytes per weight (scales and zero points
    included), everything else (embeddings, output head, norms, biases) at `other_bytes` per parameter."""
    linear = 0.0
    linear_params = 0
    for k, n_out, count in linear_shapes(arch):
        linear += count * k * n_out * fmt.linear_bytes_per_weight(k)
        linear_params += count * k * n_out
    return int(linear + (arch.n_params - linear_params) * other_bytes)


def group_problem(fmt: QuantFormat, arch: Any, parts: int = 1, per: str = "") -> str | None:
    """Why the model's layers cannot be split into `fmt`'s groups, or None. `parts` > 1: each of `parts` slices of
    a row-parallel layer's inputs must hold whole groups too (`per`: what a slice is, for the message)."""
    if fmt.group_size == -1 or arch is None:
        return None
    q = arch.n_heads * arch.head_dim
    for what, k in (("hidden size", arch.hidden), ("attention output width", q), ("intermediate size", arch.intermediate)):
        if k and k % fmt.group_size:
            return f"group size {fmt.group_size} does not divide the model's {what} {k}"
    for what, k in (("attention output width", q), ("intermediate size", arch.intermediate)):  # row-parallel inputs
        if parts > 1 and k and (k // parts) % fmt.group_size:
            return f"group size {fmt.group_size} does not divide the {what} per GPU ({k} / {per or parts})"
    return None


_GPTQ = re.compile(r"gptq-w(\d+)(?:g(\d+))?")
_AWQ = re.compile(r"awq-w(\d+)(?:g(\d+))?")
W8A8_INT8 = "w8a8-int8"
# How evalkit's own variants of each method are written: llm-compressor writes compressed-tensors for all three
# (evalkit/quantize.py), so an engine loads them through its compressed-tensors schemes, not its gptq/awq methods.
VARIANT_CHECKPOINT = {"gptq": "compressed-tensors", "awq": "compressed-tensors", "w8a8-int8": "compressed-tensors"}


def looks_like_format(name: str | None) -> bool:
    """Whether `name` is meant as one of these formats (gptq-..., awq-..., w8a8-...), valid or not."""
    return bool(name) and str(name).lower().startswith(("gptq-", "awq-", "w8a8-", "w4a16", "w8a16"))


def name_parts(name: str) -> tuple[str, int, int] | None:
    """(method, weight bits, group size; -1: per output channel) of a well-formed format name, else None."""
    text = name.lower()
    if text == W8A8_INT8:
        return W8A8_INT8, 8, -1
    m = _GPTQ.fullmatch(text) or _AWQ.fullmatch(text)
    if m is None:
        return None
    return ("gptq" if text.startswith("gptq") else "awq"), int(m.group(1)), int(m.group(2)) if m.group(2) else -1


def name_problem(name: str) -> str | None:
    """What is wrong with a format name, in one clause: an unknown format, or bits or a group size that no
    registered engine's kernels take (each engine's `EngineSpec.format_problem`, through the registry); None when
    it names a format some engine runs."""
    if name_parts(name) is None:
        return (f"unknown quantization format {name!r} (expected gptq-w<bits>[g<group>], awq-w4g<group> or w8a8-int8, "
                "e.g. gptq-w4g128, gptq-w8, awq-w4g128)")
    from evalkit.engines import format_problem

    return format_problem(name)


def parse(name: str | None, checkpoint: str | None = None) -> QuantFormat | None:
    """The format a name denotes (None: not a format name, or an invalid one: see name_problem), written as
    evalkit's variants are (VARIANT_CHECKPOINT) unless `checkpoint` says otherwise ("gptq", "awq": a GPTQ/AWQ-format
    checkpoint such as the published ones)."""
    if not name or name_problem(name) is not None:
        return None
    parts = name_parts(name)
    assert parts is not None
    method, bits, group = parts
    text = name.lower()
    if method == W8A8_INT8:
        return QuantFormat(text, W8A8_INT8, 8, -1, False, VARIANT_CHECKPOINT[W8A8_INT8], act_bits=8)
    return QuantFormat(text, method, bits, group, method == "awq", checkpoint or VARIANT_CHECKPOINT[method])


def from_hf_config(config: dict[str, Any]) -> QuantFormat | None:
    """The format of a pre-quantized checkpoint from its config.json `quantization_config` (None: not quantized,
    or a method other than these). A GPTQ/AWQ checkpoint's bits and group size are taken as written, even when
    no kernel takes them: the plan's rules then say so."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in ("gptq", "awq"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        group = int(q.get("group_size") or q.get("q_group_size") or -1)
        sym = bool(q.get("sym", True)) if method == "gptq" else False
        name = f"{method}-w{bits}" + (f"g{group}" if group != -1 else "")
        return QuantFormat(name, method, bits, group, not sym if method == "gptq" else bool(q.get("zero_point", True)),
                           method, desc_act=bool(q.get("desc_act", False)))
    if method == "compressed-tensors":
        return _from_compressed_tensors(q)
    return None


def _from_compressed_tensors(q: dict[str, Any]) -> QuantFormat | None:
    groups = q.get("config_groups") or {}
    for group in groups.values():
        weights, inputs = group.get("weights") or {}, group.get("input_activations")
        if weights.get("type", "int") != "int":
            return None  # FP8 / FP4 compressed-tensors: not one of these formats
        bits = int(weights.get("num_bits", 8))
        if inputs and int(inputs.get("num_bits", 16)) == 8 and bits == 8:
            return QuantFormat(W8A8_INT8, "w8a8-int8", 8, -1, False, "compressed-tensors", act_bits=8)
        if inputs is None:
            gs = weights.get("group_size")
            size = int(gs) if gs and weights.get("strategy") == "group" else -1
            sym = bool(weights.get("symmetric", True))
            name = f"w{bits}a16" + (f"g{size}" if size != -1 else "")  # GPTQ or AWQ written by llm-compressor
            return QuantFormat(name, "wna16", bits, size, not sym, "compressed-tensors")
    return None
