"""The hf engine's batched decoder: left-padded prompts in a transformers `StaticCache`, one decode step per
token, on a CUDA device each step replayed as a CUDA graph over a `torch.compile`d forward (see
`DecodeForward` for why), and the token pick (greedy, or temperature + top-p with a per-request generator).

Kept apart from `evalkit.engines.hf` (the engine: loading, scoring, description) because this is the part that
knows about CUDA graphs, static caches and compilation; torch and transformers are imported only when used.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from evalkit.engines.base import SamplingParams

if TYPE_CHECKING:
    import torch


def pick(logits: "torch.Tensor", sampling: SamplingParams, gen: "torch.Generator") -> int:
    """Greedy at temperature 0; else softmax(logits / T), restricted to the top-p nucleus, sampled with `gen`."""
    import torch

    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < sampling.top_p  # the smallest prefix reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))


def decode_forward(model: Any, cache: Any, ids: Any, pos: Any, mask: Any) -> Any:
    """One forward over the cache: each row's last-position logits (rows, vocab), in the model's dtype. A module
    function, so torch.compile traces it once for every stepper (dynamo keys its compiled code on this code)."""
    out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1]


class DecodeForward:
    """The decode step's forward for one engine: `torch.compile`d (inductor) when wanted, else `decode_forward`.

    Why compile: on a GPU, a CUDA graph removes the launches from Python but still runs every kernel of the
    eager forward one after another (~1,500 for a 30-layer Llama: RMSNorm alone is 7 kernels, rotary ~12 per
    layer), and at batch 1 each costs a couple of microseconds whatever its size, so the step is bound by the
    kernel count, not by the bytes it reads. Inductor fuses the elementwise chains into a few kernels per
    layer; the CUDA graph then replays those. One compile per engine (dynamo marks batch and cache length
    dynamic at the shapes it meets next, so a run compiles about three times); if compiling fails the steps run
    the eager forward and `error` says why. The fused kernels round differently from the eager ones (fewer
    intermediate roundings in 16-bit): decode log-probs stay within the dtype's tolerance (tests/test_gpu.py)."""

    def __init__(self, compile_it: bool) -> None:
        self.compiled: Any = None
        if compile_it:
            import torch

            self.compiled = torch.compile(decode_forward, fullgraph=True)
        self.error: str | None = None
        self.first_calls_s = 0.0  # steps that traced or compiled (a stepper's first), compile time included

    @property
    def active(self) -> bool:
        return self.compiled is not None and self.error is None

    def first_call(self, *args: Any) -> Any:
        """A stepper's first step: compiles (or finds the compiled code) here; eager from now on if that fails.
        A failure leaves no trace on the cache: with fullgraph, nothing runs until compiling has succeeded."""
        if not self.active:
            return decode_forward(*args)
        start = time.perf_counter()
        try:
            return self.compiled(*args)
        except Exception as e:  # any compiler failure leaves the eager forward, which is correct
            self.error = first_line(e)
            return decode_forward(*args)
        finally:
            self.first_calls_s += time.perf_counter() - start

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args) if self.active else decode_forward(*args)


class BatchStepper:
    """Prefill and decode steps for one batch shape over a transformers `StaticCache`.

    The attention mask is ours, 4-D (rows, 1, queries, slots) and additive (0 where a row may look, the
    dtype's minimum elsewhere): transformers uses a 4-D mask as given, so a step runs no mask-building code
    (whose checks read tensors on the host and cannot be captured). Left padding: every row writes slot s
    at step s; a row's positions count its own tokens only.

    A decode step reads nothing back: the slot it writes is a device counter, the positions and the mask's
    new column are computed from it on the device, and each row's greedy pick is written as the next step's
    input (sampling overwrites it with `feed`). So the whole step is one CUDA graph, and greedy decoding
    costs the host one replay and one small read per token. On CUDA, the first decode step runs eagerly on
    a side stream (the warm-up torch.cuda.graph needs, and torch.compile's compile; it also writes that
    step's real KV) and the next ones replay the captured step; if capture fails the steps stay eager and
    `graph_error` says why.
    """

    def __init__(self, model: Any, n: int, slots: int, device: str, graphs: bool, dtype: Any,
                 forward: DecodeForward) -> None:
        import torch
        import transformers

        self.model, self.shape, self.device, self.forward = model, (n, slots), device, forward
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=slots)
        self.min = torch.finfo(dtype).min
        self.mask = torch.full((n, 1, 1, slots), self.min, dtype=dtype, device=device)  # decode: one query row
        self.ids = torch.zeros((n, 1), dtype=torch.long, device=device)  # the next step's input tokens
        self.pos = torch.zeros((n, 1), dtype=torch.long, device=device)
        self.pads = torch.zeros((n,), dtype=torch.long, device=device)
        self.slot = torch.zeros((1,), dtype=torch.long, device=device)  # the cache slot the next step writes
        self.want_graph = graphs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graphed = False
        self.graph_error: str | None = None
        self.stepped = False  # whether a decode step ran (the first one traces, compiles, captures)
        self.out: Any = None  # the captured step's logits (the graph's output, rewritten by each replay)

    def prefill(self, ids: Any, pads: Any, width: int) -> Any:
        """The left-padded prompts (n, width) into the cache: their last logits (n, vocab), model dtype."""
        import torch

        with torch.inference_mode():  # the cache's tensors are inference tensors: every update happens in here
            return self._prefill(ids, pads, width)

    def _prefill(self, ids: Any, pads: Any, width: int) -> Any:
        import torch

        slots = self.shape[1]
        self.cache.reset()  # also on a reused stepper: zero the counters, same tensors (the graph's addresses)
        self.pads.copy_(pads)
        cols = torch.arange(slots, device=self.device)
        valid = cols[None, :] >= self.pads[:, None]  # (n, slots): slots of a row's own tokens (and later ones)
        rows = torch.arange(width, device=self.device)
        causal = cols[None, :] <= rows[:, None]  # (width, slots)
        allowed = valid[:, None, :] & causal[None, :, :]
        zero = torch.zeros((), dtype=self.mask.dtype, device=self.device)
        mask = torch.where(allowed, zero, self.min)[:, None]  # (n, 1, width, slots)
        pos = (rows[None, :] - self.pads[:, None]).clamp(min=0)
        self.mask.copy_(mask[:, :, -1:, :])  # the decode mask starts as the last prompt row's
        logits = decode_forward(self.model, self.cache, ids, pos, mask)  # eager: prompt widths vary
        self.ids.copy_(logits.argmax(dim=-1, keepdim=True))
        self.slot.fill_(width)
        return logits

    def feed(self, tokens: list[int]) -> None:
        """Tokens chosen on the host (sampling) as the next step's input, instead of the greedy picks."""
        import torch

        with torch.inference_mode():
            self.ids[:, 0] = torch.tensor(tokens, dtype=torch.long, device=self.device)

    def picks(self) -> list[int]:
        """Each row's greedy pick from the last step (waits for it)."""
        return self.ids[:, 0].tolist()

    def step(self) -> Any:
        """One decode step: the rows' `ids` at the cache slot the counter says; their logits (n, vocab), model
        dtype (on a graph, its output buffer: read it before the next step)."""
        import torch

        with torch.inference_mode():
            if self.graph is not None:
                self.graph.replay()
                return self.out
            if not self.stepped:
                self.stepped = True
                if self.want_graph:
                    return self._capture()
                return self._step(self.forward.first_call)
            return self._step(self.forward)

    def _step(self, forward: Any) -> Any:
        """The step itself, all on the device (capturable): positions and the mask's new column from the slot
        counter, the forward, the greedy picks as the next input, the counter advanced."""
        self.pos.copy_((self.slot - self.pads)[:, None])
        self.mask[:, 0, 0].index_fill_(1, self.slot, 0.0)
        logits = forward(self.model, self.cache, self.ids, self.pos, self.mask)
        self.ids.copy_(logits.argmax(dim=-1, keepdim=True))
        self.slot.add_(1)
        return logits

    def _capture(self) -> Any:
        import torch

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the warm-up (and compile): this step, for real
            logits = self._step(self.forward.first_call)
        torch.cuda.current_stream().wait_stream(stream)
        try:
            graph = torch.cuda.CUDAGraph()
            # The captured step advances the counters (ours and the cache's) itself, as the eager step did:
            # capture only records, so they stay where the warm-up left them and the first replay writes the
            # next slot.
            with torch.cuda.graph(graph):
                self.out = self._step(self.forward)
            self.graph, self.graphed = graph, True
        except Exception as e:  # any capture failure leaves the eager steps, which are correct
            self.graph_error = first_line(e)
            torch.cuda.synchronize()
        return logits


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
