"""llama.cpp engine (llama-cpp-python, in-process): generation, teacher-forced log-probabilities.

The module holds the engine's spec and options; `llama_cpp` itself is imported only when a model loads, through
`load_llama_cpp` (libllama bound to its own C++ symbols first).
"""
from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Iterator, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores, generate_in_turn
from evalkit.engines import llamacpp_rules
from evalkit.engines.llamacpp_lib import load_llama_cpp
from evalkit.engines.llamacpp_memory import kv_precision, predict_llamacpp
from evalkit.engines.spec import Capability, DoctorRow, EngineSpec, UnitResources
from evalkit.engines.tokenizer import TokenizerOnly
from evalkit.errors import ModelFileError
from evalkit.hardware import HardwareUse, Precision, describe_devices, detect_accelerators, engine_threads, gguf_type, is_fp8, is_loading_for_later


# llama.cpp's KV-cache types (common/arg.cpp kv_cache_types) and their ggml type ids (ggml.h enum ggml_type).
KV_TYPES: dict[str, int] = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
UNQUANTIZED_KV = frozenset({"f32", "f16", "bf16"})


class LlamaCppOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n_ctx: int = Field(default=4096, ge=0)  # 0: the model's own training context
    # "auto": every layer when this llama-cpp-python build can offload and a GPU answers, else 0 (CPU); -1: every layer.
    n_gpu_layers: Annotated[int, Field(ge=-1)] | Literal["auto"] = "auto"
    tensor_split: list[Annotated[float, Field(ge=0)]] | None = Field(default=None, min_length=1)
    n_threads: int | None = Field(default=None, ge=1)  # None: every core this process may use (sched_getaffinity)
    n_batch: int = Field(default=512, ge=1)
    # Flash attention: false (llama-cpp-python's default), true, or "auto" (llama.cpp's own tools' default, `-fa
    # auto`: llama.cpp decides per device, on for CPU). What ran is read back from llama.cpp's load log into the
    # manifest's engine info (flash_attn, flash_attn_asked). Not "auto" by default: on this build's CPU path it
    # moves Gemma 3 270M's log-probs by up to 0.43 nats and makes them depend on the batch shape (README).
    flash_attn: bool | Literal["auto"] = False
    chat_template: Literal["auto", "none"] = "auto"
    # KV-cache precision (llama.cpp's -ctk / -ctv): the types llama.cpp's tools accept for the cache. A quantized V
    # cache needs flash attention (llama.cpp refuses the context otherwise: checked here, at plan time).
    type_k: KvType = "f16"
    type_v: KvType = "f16"

    @model_validator(mode="after")
    def _quantized_v_needs_flash_attn(self) -> LlamaCppOptions:
        # "auto" is allowed: llama.cpp turns flash attention on for a quantized V cache (llama_init_from_model).
        if self.type_v not in UNQUANTIZED_KV and self.flash_attn is False:
            raise ValueError(f"type_v {self.type_v} (a quantized V cache) needs flash_attn: true or auto "
                             "(llama.cpp refuses it with flash attention off)")
        return self

    @field_validator("tensor_split")
    @classmethod
    def _some_share(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and not any(x > 0 for x in v):
            raise ValueError("tensor_split needs at least one share above 0")
        return v


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32 (numpy, in place-friendly: the vocab can be 262k wide)."""
    logits = logits.astype(np.float32, copy=False)
    m = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)) + m
    return logits - lse


_KV_LINE = re.compile(r"llama_kv_cache: size =\s*([0-9.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers.*?K \((\w+)\):\s*([0-9.]+) MiB, V \((\w+)\):\s*([0-9.]+) MiB")


def parse_kv_cache(log_text: str) -> dict[str, Any] | None:
    """llama.cpp's own account of the KV cache it allocated (its load log's `llama_kv_cache: size = ...` line,
    summed over the lines a context with windowed layers writes): types, cells, layers and bytes."""
    found = _KV_LINE.findall(log_text)
    if not found:
        return None
    mib = 1024 * 1024
    return {
        "type_k": found[0][3], "type_v": found[0][5], "cells": int(found[0][1]),
        "layers": sum(int(f[2]) for f in found),
        "k_bytes": round(sum(float(f[4]) for f in found) * mib), "v_bytes": round(sum(float(f[6]) for f in found) * mib),
        "bytes": round(sum(float(f[0]) for f in found) * mib),
    }


class _LoadLog:
    """llama.cpp's log lines while a model loads (verbose=False prints none), read through its log callback and
    handed back to llama-cpp-python's own callback afterwards."""

    def __init__(self, llama_cpp: Any) -> None:
        self._lib = llama_cpp
        self.lines: list[str] = []

    def __enter__(self) -> _LoadLog:
        import ctypes

        @self._lib.llama_log_callback
        def callback(level: int, text: bytes, user_data: Any) -> None:
            self.lines.append(text.decode("utf-8", errors="replace"))

        self._callback = callback  # kept alive while llama.cpp holds it
        self._lib.llama_log_set(callback, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc: object) -> None:
        import ctypes

        from llama_cpp import _logger

        self._lib.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))

    def kv_cache(self) -> dict[str, Any] | None:
        return parse_kv_cache("".join(self.lines))

    def flash_attn(self) -> bool | None:
        return parse_flash_attn("".join(self.lines))


_FA_RESOLVED = re.compile(r"Flash Attention (enabled|not supported, set to disabled)")
_FA_ASKED = re.compile(r"flash_attn\s*=\s*(enabled|disabled|auto)")


def parse_flash_attn(log_text: str) -> bool | None:
    """Whether llama.cpp ran flash attention, from its load log: an "auto" context says how it resolved it
    ("resolve_fused_ops: Flash Attention enabled" / "... not supported, set to disabled"); a forced one prints
    "flash_attn = enabled|disabled". None when the log says neither."""
    resolved = _FA_RESOLVED.findall(log_text)
    if resolved:
        return resolved[-1] == "enabled"
    asked = _FA_ASKED.findall(log_text)
    if asked and asked[-1] != "auto":
        return asked[-1] == "enabled"
    return None


@contextmanager
def _flash_attn_type(llama_cpp: Any, asked: bool | str) -> Iterator[bool]:
    """llama-cpp-python's Llama takes flash_attn as a bool (enabled/disabled); "auto" (llama.cpp's own default)
    reaches llama.cpp by mapping its `enabled` to LLAMA_FLASH_ATTN_TYPE_AUTO while the context is made. Yields
    the bool to pass."""
    if asked != "auto":
        yield bool(asked)
        return
    lib = llama_cpp.llama_cpp
    enabled = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
    lib.LLAMA_FLASH_ATTN_TYPE_ENABLED = lib.LLAMA_FLASH_ATTN_TYPE_AUTO
    try:
        yield True
    finally:
        lib.LLAMA_FLASH_ATTN_TYPE_ENABLED = enabled


# What a seeded request can promise on this engine (manifest and report quote it).
REPRODUCIBILITY = (
    "bit-identical: a sampler seeded per request, and a prompt prefix is reused from the cache only where every "
    "logit equals an evaluation from an empty cache, so the same request and seed give the same tokens "
    "whatever ran before"
)


class LlamaCppEngine(Engine):
    name = "llamacpp"

    def __init__(self, model_path: str, options: LlamaCppOptions) -> None:
        self.options = options
        self.model_path = str(model_path)
        llama_cpp = load_llama_cpp()

        threads = options.n_threads or engine_threads()
        start = time.perf_counter()
        log = _LoadLog(llama_cpp)
        try:
            with log, _flash_attn_type(llama_cpp, options.flash_attn) as flash_attn:
                self._llm = llama_cpp.Llama(
                    model_path=self.model_path,
                    n_ctx=options.n_ctx,
                    n_gpu_layers=gpu_layers(options),
                    tensor_split=options.tensor_split,
                    # llama-cpp-python's default is half the logical CPUs for generation: one thread of two here.
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_batch=options.n_batch,
                    n_ubatch=options.n_batch,
                    flash_attn=flash_attn,
                    type_k=KV_TYPES[options.type_k],
                    type_v=KV_TYPES[options.type_v],
                    logits_all=False,  # scoring reads logits per batch itself; logits_all would cost n_ctx x vocab floats
                    verbose=False,
                )
        except ValueError as e:  # llama-cpp-python raises ValueError for files it cannot load
            raise ModelFileError(self.model_path, f"llama.cpp could not load the model ({e})") from None
        self._load_s = time.perf_counter() - start
        self._kv_cache = log.kv_cache()  # what llama.cpp says it allocated for the KV cache (info()'s kv_cache)
        # What llama.cpp ran (an "auto" resolved by llama.cpp itself); the option when the log says nothing.
        ran = log.flash_attn()
        self._flash_attn = ran if ran is not None else (options.flash_attn if options.flash_attn != "auto" else None)
        self._exact_rows = 0  # leading context rows a fresh evaluation computes the same way (`_prefill`)
        # Reuse points: multiples of 16 where every layer runs on the CPU (measured exact), of 64 elsewhere; none
        # with flash attention (on, or not known to be off), whose rows change with the cache's extent.
        on_cpu = gpu_layers(options) == 0 or not llama_gpu_offload()
        self._on_cpu = on_cpu
        self._computed = False  # whether the model has evaluated a batch in this process (`prepare_for_timing`)
        self._reuse_align = self._CPU_REUSE_ALIGN if on_cpu and options.n_batch % self._CPU_REUSE_ALIGN == 0 else self._REUSE_ALIGN
        self._reused_prompt_tokens = 0  # prompt tokens served from the KV cache instead of evaluated
        # Loaded early (executors.warm), the count is a guess at the cores free at its turn: the first call checks.
        self._threads_checked = -math.inf if is_loading_for_later() else time.monotonic()
        self._threads_fixed = False  # from `prepare_for_timing` on: no re-check inside a timed level
        self._threads_used = {threads}
        self._init_tokenizer()

    def _init_tokenizer(self) -> None:
        """BOS and chat template from the GGUF's metadata (also used by the vocabulary-only stand-in)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        meta = self._llm.metadata
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "true") == "true"
        self._bos = self._llm.token_bos() if self._llm.token_bos() >= 0 else None
        template = meta.get("tokenizer.chat_template")
        self._chat: Any = None  # a llama_cpp Jinja2ChatFormatter
        if template and self.options.chat_template == "auto":
            vocab = self._llm._model
            self._chat = Jinja2ChatFormatter(
                template=template,
                eos_token=vocab.token_get_text(self._llm.token_eos()),
                bos_token=vocab.token_get_text(self._llm.token_bos()) if self._bos is not None else "",
            )

    # -- tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos and self._add_bos, special=False)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._llm.detokenize(list(token_ids)).decode("utf-8", errors="replace")

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if request.chat and self._chat is not None:
            rendered = self._chat(messages=[{"role": "user", "content": request.prompt}]).prompt
            bos_text = self._chat.bos_token
            # Templates that write the BOS text themselves must not get a second BOS token.
            add_bos = self._add_bos and not (bos_text and rendered.startswith(bos_text))
            return self._llm.tokenize(rendered.encode("utf-8"), add_bos=add_bos, special=True)
        return self.tokenize(request.prompt, add_bos=True)

    def prompt_format(self, request: GenRequest) -> str:
        return "chat" if request.chat and self._chat is not None and request.prompt_token_ids is None else "completion"

    # -- threads --------------------------------------------------------------------------------

    _THREADS_RECHECK_S = 15.0

    def _follow_free_cores(self) -> None:
        """With n_threads unset, the thread count follows the cores other work leaves free, checked again at
        calls at least 15 s apart (about once a suite): a deployment that started while something else
        was busy gets the cores back once it is done, instead of running on half of them to the end.
        The numbers do not change with it (n_threads is not in the numerics key)."""
        if self.options.n_threads is not None or self._threads_fixed or time.monotonic() - self._threads_checked < self._THREADS_RECHECK_S:
            return
        threads = engine_threads(sample_s=0.3)
        self._threads_checked = time.monotonic()
        if threads != self._llm.n_threads or threads != self._llm.n_threads_batch:
            self._llm._ctx.set_n_threads(threads, threads)
            self._llm.n_threads = self._llm.n_threads_batch = threads
        self._threads_used.add(threads)

    # -- generation -----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        """One context, requests served in arrival order (what llama.cpp in-process really does).

        ttft_s/total_s are measured from the moment this call started: all requests arrive together.
        """
        llama_cpp = load_llama_cpp()

        self._follow_free_cores()

        vocab = self._llm._model.vocab
        return generate_in_turn(self, requests, sampling, self.options.n_ctx, lambda tokens: self._decode(tokens, sampling),
                                lambda tok: bool(llama_cpp.llama_vocab_is_eog(vocab, tok)))

    def _decode(self, tokens: list[int], sampling: SamplingParams) -> Iterator[int]:
        """Stream the tokens sampled after `tokens`: llama_decode one token at a time, next to nothing per token
        in Python (llama-cpp-python's Llama.generate spent ~0.3 ms a token around llama_decode on the H200, where
        a token takes ~1.3 ms: issue 21 wants >= 0.95x llama-bench's decode)."""
        import ctypes

        llama_cpp = load_llama_cpp()
        llm = self._llm
        self._prefill(tokens)  # the prompt's last logits are ready: the first token is sampled from them
        ctx, batch, decode = llm._ctx.ctx, llm._batch.batch, llama_cpp.llama_decode
        chain = None
        if sampling.temperature == 0.0:
            # Greedy: the first maximum of the last row's logits, read in place. llama.cpp's greedy sampler gives the
            # same token but first copies all n_vocab logits into token-data structs (~50 us a token here, ~6 us so).
            row, logits = ctypes.c_float * llm.n_vocab(), llama_cpp.llama_get_logits_ith

            def sample() -> int:
                return int(np.frombuffer(row.from_address(ctypes.addressof(logits(ctx, -1).contents)), np.float32).argmax())
        else:
            chain = sampler_chain(sampling)

            def sample() -> int:
                return int(llama_cpp.llama_sampler_sample(chain, ctx, -1))

        batch.n_tokens = 1
        batch.seq_id[0][0], batch.n_seq_id[0], batch.logits[0] = 0, 1, True
        ids, pos = llm.input_ids, len(tokens)
        try:
            tok = sample()
            while True:
                yield tok
                batch.token[0], batch.pos[0] = tok, pos
                if rc := decode(ctx, batch):
                    raise RuntimeError(f"llama_decode returned {rc}")
                ids[pos] = tok  # Llama's own bookkeeping of what the context holds
                pos += 1
                llm.n_tokens = pos
                tok = sample()
        finally:
            if chain is not None:
                llama_cpp.llama_sampler_free(chain)

    _REUSE_ALIGN = 64  # reuse points: multiples of this, at least this many rows before the prompt's end
    _CPU_REUSE_ALIGN = 16  # the same where every layer runs on the CPU (measured, `_prefill`)

    def _prefill(self, tokens: Sequence[int]) -> None:
        """Leave `tokens` evaluated in the context (its last row's logits ready), reusing the cached prefix of
        what ran before where that gives exactly the logits an evaluation from an empty cache gives (counted in
        run_stats' reused_prompt_tokens).

        Why it is exact: a row's logits depend on where it sits in its batch only through how ggml groups rows.
        Measured with every reuse point of a 150-token prompt and every 16th of a 600-token one, all rows'
        logits compared with a fresh pass (benchmarks/reuse_sweep.py), on the AVX-512 and the AVX2 builds (SmolLM2
        Q4_1 and Q2_K, Gemma 3 Q4_K_M), 1 and 2 threads alike: Q4_1 differs only in one-row batches; Q2_K in batches of 2 to 7 rows; the
        K-quants' repacked kernels take rows four at a time, so Gemma's last row differs when the reuse point
        is not a multiple of 4; with flash attention every row differs at most reuse points (SmolLM2 Q4_1,
        multiples of 2 up to 150), so it reuses nothing. So a reuse point is a multiple of 16 (64 with layers on
        a GPU, whose kernels were not measured so) leaving at least as many rows to evaluate, only rows a fresh
        pass would compute the same way are kept for later reuse (`_exact_rows`: not generated tokens, not
        batches shorter than the alignment), and batches are cut at absolute multiples of n_batch as a fresh
        pass cuts them. Long-context prompts sharing their filler, few-shot prompts sharing their examples and
        chat prompts sharing a system prompt then evaluate only what differs.
        """
        llm = self._llm
        align = self._reuse_align
        usable = min(llm.n_tokens, self._exact_rows) if self._flash_attn is False else 0
        keep = 0
        for a, b in zip(llm.input_ids[:usable].tolist(), tokens):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(tokens) - align)
        keep = max(0, keep - keep % align)
        if not llm._ctx.kv_cache_seq_rm(-1, keep, -1):  # some caches (small SWA) cannot drop a tail
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            keep = 0
        llm.n_tokens = keep
        self._exact_rows = keep
        start = keep
        while start < len(tokens):
            end = min(len(tokens), (start // llm.n_batch + 1) * llm.n_batch)
            llm.eval(tokens[start:end])
            if end - start >= align:
                self._exact_rows = end
            start = end
            self._computed = True
        self._reused_prompt_tokens += keep

    def _forget_context(self) -> None:
        """The context no longer holds what `_prefill` and generate() think it holds: start empty."""
        self._llm.reset()
        self._llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        self._exact_rows = 0

    # -- likelihoods ----------------------------------------------------------------------------

    def _forward_logprobs(self, tokens: Sequence[int], positions: Sequence[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Teacher-forced pass over `tokens` (from an empty cache); yields (start, logprob rows) per batch.

        Row j of a batch starting at `start` is log p(. | tokens[:start + j + 1]).
        """
        llm = self._llm
        if len(tokens) > self.options.n_ctx:
            raise ValueError(f"sequence of {len(tokens)} tokens exceeds n_ctx={self.options.n_ctx}")
        self._forget_context()
        n_vocab = llm.n_vocab()
        for start in range(0, len(tokens), llm.n_batch):
            chunk = list(tokens[start : start + llm.n_batch])
            llm._batch.set_batch(batch=chunk, n_past=start, logits_all=True)
            llm._ctx.decode(llm._batch)
            self._computed = True
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(chunk), n_vocab))
            yield start, log_softmax(logits)
        self._forget_context()  # logits_all rows were written behind generate()'s bookkeeping

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        self._follow_free_cores()
        results = []
        for seq in sequences:
            logprobs: list[float | None] = [None] * len(seq)
            top: list[list[tuple[int, float]]] | None = [[] for _ in seq] if top_k else None
            for start, rows in self._forward_logprobs(seq):
                for j in range(rows.shape[0]):
                    pos = start + j + 1  # row j predicts the token at pos
                    if pos >= len(seq):
                        break
                    logprobs[pos] = float(rows[j, seq[pos]])
                    if top is not None:
                        idx = np.argpartition(rows[j], -top_k)[-top_k:]
                        idx = idx[np.argsort(rows[j, idx])[::-1]]
                        top[pos] = [(int(t), float(rows[j, t])) for t in idx]
            results.append(TokenScores(token_ids=list(seq), logprobs=logprobs, top=top))
        return results

    def full_logprobs(self, tokens: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
        """Full-vocabulary log-probabilities at every position (row j of a block at `start` predicts
        tokens[start + j + 1]); see `_forward_logprobs`. `token_distributions` is the interface method."""
        return self._forward_logprobs(tokens)

    def _decode_rows(self, tokens: Sequence[int], first: int) -> Iterator[tuple[list[int], np.ndarray]]:
        """One teacher-forced pass over `tokens` from an empty cache, asking the context for logits only at
        rows first-1 .. n-2 (as llama-perplexity asks only for rows >= n_ctx/2); yields, per llama batch,
        the positions whose logits were computed and a view of those raw logits (valid until the next step).
        """
        llm = self._llm
        n = len(tokens)
        if n > self.options.n_ctx:
            raise ValueError(f"sequence of {n} tokens exceeds n_ctx={self.options.n_ctx}")
        if not 1 <= first <= n:
            raise ValueError(f"first={first} must be in 1..{n}")
        n_vocab = llm.n_vocab()
        self._forget_context()
        batch = llm._batch.batch
        try:
            for start in range(0, n, llm.n_batch):
                piece = tokens[start : start + llm.n_batch]
                batch.n_tokens = len(piece)
                rows = []
                for i, tok in enumerate(piece):
                    pos = start + i
                    batch.token[i] = tok
                    batch.pos[i] = pos
                    batch.seq_id[i][0] = 0
                    batch.n_seq_id[i] = 1
                    want = first - 1 <= pos < n - 1  # row at pos predicts token pos + 1
                    batch.logits[i] = want
                    if want:
                        rows.append(pos)
                llm._ctx.decode(llm._batch)
                self._computed = True
                if rows:
                    yield rows, np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(rows), n_vocab))
        finally:
            self._forget_context()  # rows were written behind generate()'s bookkeeping

    def score_span(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
        """The fast path for long spans (perplexity): logits only for the scored rows, then logsumexp +
        gather + bucketed top-k (`nll_and_topk`) instead of a full log-softmax and argpartition per row."""
        from evalkit.metrics.likelihood import nll_and_topk

        self._follow_free_cores()
        tokens = list(token_ids)
        nll: list[float] = []
        top: list[list[list[float]]] = []
        for rows, logits in self._decode_rows(tokens, first):
            b_nll, ids, lps = nll_and_topk(logits, [tokens[p + 1] for p in rows], top_k)
            nll += b_nll.tolist()
            top += [[[int(t), float(lp)] for t, lp in zip(ti, li)] for ti, li in zip(ids, lps)]
        return nll, top

    _DIST_BLOCK = 32  # rows per yielded block: 32 x 262k float32 = 34 MB

    def token_distributions(self, token_ids: Sequence[int], first: int) -> Iterator[tuple[int, np.ndarray]]:
        """Full-vocabulary float32 log-softmax for positions >= first, in blocks of rows copied out of the
        context (valid after the next batch). The normaliser is summed in float64, as llama-perplexity's
        KL-divergence mode does in double."""
        self._follow_free_cores()
        tokens = list(token_ids)
        for rows, logits in self._decode_rows(tokens, first):
            for b0 in range(0, len(rows), self._DIST_BLOCK):
                x = logits[b0 : b0 + self._DIST_BLOCK].astype(np.float32)  # a copy
                m = x.max(axis=1, keepdims=True)
                lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True, dtype=np.float64)).astype(np.float32)
                yield rows[b0] + 1, x - lse


    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        """Last-position log-softmax read at `candidates`. Consecutive prompts sharing a prefix (few-shot
        blocks) reuse its KV cache where that changes no logit (`_prefill`); only the last row's logits are
        computed."""
        self._follow_free_cores()
        llm = self._llm
        n_vocab = llm.n_vocab()
        out: list[list[float]] = []
        for prompt in map(list, prompts):
            if len(prompt) > self.options.n_ctx:
                raise ValueError(f"sequence of {len(prompt)} tokens exceeds n_ctx={self.options.n_ctx}")
            self._prefill(prompt)
            row = log_softmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(1, n_vocab)))[0]
            out.append([float(row[c]) for c in candidates])
        return out

    # -- description ----------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        llama_cpp = load_llama_cpp()

        meta = self._llm.metadata
        return EngineInfo(
            engine=self.name,
            engine_version=version("llama-cpp-python"),
            model_path=self.model_path,
            add_bos=self._add_bos,
            bos_token_id=self._bos,
            chat_template="gguf:tokenizer.chat_template" if self._chat is not None else None,
            vocab_size=self._llm.n_vocab(),
            n_ctx=self.options.n_ctx,
            load_s=self._load_s,
            extra={
                "architecture": meta.get("general.architecture"),
                "file_type": meta.get("general.file_type"),
                "n_threads": self._llm.n_threads,
                "n_threads_batch": self._llm.n_threads_batch,
                "n_threads_used": sorted(self._threads_used),  # every count it ran with (they follow the free cores)
                "sampling_reproducibility": REPRODUCIBILITY,
                "n_gpu_layers": gpu_layers(self.options),
                "offload": ("every layer on the GPU" if gpu_layers(self.options) < 0 else f"{gpu_layers(self.options)} layers on the GPU")
                if gpu_layers(self.options) and llama_cpp.llama_supports_gpu_offload() else "CPU",
                "tensor_split": self.options.tensor_split,
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "weights_bytes": int(llama_cpp.llama_model_size(self._llm.model)),  # every tensor, as loaded
                # Flash attention as llama.cpp ran it (read from its load log), and as the options asked.
                "flash_attn": self._flash_attn,
                "flash_attn_asked": self.options.flash_attn,
                # The KV cache as llama.cpp allocated it (types, cells, bytes), from its own load log.
                "kv_cache": self._kv_cache,
            },
        )

    def run_stats(self) -> dict[str, Any]:
        return {"reused_prompt_tokens": self._reused_prompt_tokens}

    def prepare_for_timing(self) -> bool:
        """The thread count is settled now and kept from here on: a re-check of the free cores samples the load
        for 0.3 s, which inside a timed level read as latency (a c1 level took 1.09 s instead of 0.84). No
        warm-up is needed once the model has computed in this process with every layer on the CPU: ggml's CPU
        backend compiles and captures nothing per batch shape (in-process requests are served one at a time
        anyway), and by then the mapped weights are paged in and the context's buffers touched. On a GPU the
        warm-up stays (CUDA graphs are captured per shape)."""
        self._threads_checked = -math.inf
        self._follow_free_cores()
        self._threads_fixed = True
        return not (self._on_cpu and self._computed)

    def close(self) -> None:
        self._llm.close()


def sampler_chain(sampling: SamplingParams) -> Any:
    """llama.cpp's C sampler chain for `sampling` (free it with llama_sampler_free): greedy at temperature 0,
    else top-p, temperature and a distribution seeded by the request. The samples equal llama-cpp-python's
    Llama.generate(temp=t, top_p=p, top_k=0, min_p=0, repeat_penalty=1) with that seed (what evalkit used
    before): its chain adds penalties, top-k, typical and min-p samplers that return at once at those values."""
    llama_cpp = load_llama_cpp()

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if sampling.temperature == 0.0:
        parts = [llama_cpp.llama_sampler_init_greedy()]
    else:
        parts = [llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1), llama_cpp.llama_sampler_init_temp(sampling.temperature),
                 llama_cpp.llama_sampler_init_dist(sampling.seed)]
    for part in parts:
        llama_cpp.llama_sampler_chain_add(chain, part)  # the chain owns (and frees) its parts
    return chain


# -- the spec -------------------------------------------------------------------------------------


def gguf_precision(q: str | None, capability: tuple[int, int] | None) -> Precision:
    """llama.cpp: the GGUF's own types, dequantized inside its kernels."""
    if q is None:
        return Precision("not-requested", "llama.cpp runs the GGUF file as it is; its type is unknown here")
    if is_fp8(q):
        return Precision("unavailable", "llama.cpp has no FP8 weight format; use a GGUF type (Q8_0 is its 8-bit one)")
    where = "on the GPU" if capability is not None else "on the CPU"
    return Precision(
        f"gguf-{q}",
        f"llama.cpp computes with the GGUF's own {q} blocks, dequantized inside its kernels {where}; "
        "nothing is converted at load",
    )


def llama_gpu_offload() -> bool:
    """Whether the installed llama-cpp-python can offload layers to a GPU (False when not installed)."""
    try:
        return bool(load_llama_cpp().llama_supports_gpu_offload())
    except Exception:
        return False


def _doctor() -> list[DoctorRow]:
    try:
        installed: str | None = version("llama-cpp-python")
    except PackageNotFoundError:
        installed = None
    offload = ("GPU offload: yes" if llama_gpu_offload() else "GPU offload: no (CPU build)") if installed else ""
    return [DoctorRow("llama-cpp-python", installed, offload)]


def _hardware(deployment: Any) -> HardwareUse:
    accs = detect_accelerators()
    notes: list[str] = []
    gpu = bool(accs) and gpu_layers(deployment.options) != 0
    if gpu and not llama_gpu_offload():
        notes.append("n_gpu_layers is set but this llama-cpp-python build has no GPU offload: it runs on the CPU")
        gpu = False
    used = accs if gpu else []
    capability = used[0].capability if used else None
    requested = gguf_type(deployment)
    return HardwareUse(describe_devices(used), capability, requested, gguf_precision(requested, capability), tuple(notes))


def llamacpp_tokenizer(model_path: str, options: Any) -> TokenizerOnly:
    """LlamaCppEngine's tokenization on a vocabulary-only load (tokenize/prompt_token_ids are its own methods)."""
    llama_cpp = load_llama_cpp()

    class LlamaCppTokenizer(TokenizerOnly, LlamaCppEngine):
        name = "llamacpp"

        def __init__(self) -> None:
            self.options = options
            self.model_path = str(model_path)
            self._llm = llama_cpp.Llama(model_path=self.model_path, vocab_only=True, verbose=False)
            self._init_tokenizer()

        def bos(self) -> tuple[bool, int | None]:
            return self._add_bos, self._bos

        def vocab_size(self) -> int:
            return int(self._llm.n_vocab())

        def end_of_generation_ids(self) -> frozenset[int]:
            """Every id llama.cpp's vocabulary marks end-of-generation (EOS, EOT, ...)."""
            vocab = self._llm._model.vocab
            return frozenset(t for t in range(self._llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t))

        def close(self) -> None:
            self._llm.close()

    return LlamaCppTokenizer()


def gpu_layers(options: Any) -> int:
    """The n_gpu_layers llama.cpp gets: "auto" is -1 (every layer) where this build offloads and a GPU answers,
    else 0."""
    if options.n_gpu_layers != "auto":
        return int(options.n_gpu_layers)
    return -1 if detect_accelerators() and llama_gpu_offload() else 0


def _effective_numerics(values: dict[str, Any]) -> dict[str, Any]:
    """The cache keys on the layers really offloaded: "auto" on a GPU machine is not "auto" on a CPU one (nor is
    flash_attn "auto", which is on for the CPU). An f16 K or V cache (llama.cpp's default, all there was before
    type_k/type_v) is left out: earlier entries still hit."""
    values = {k: v for k, v in values.items() if not (k in ("type_k", "type_v") and v == "f16")}
    if values.get("n_gpu_layers") == "auto":
        values = {**values, "n_gpu_layers": gpu_layers(LlamaCppOptions(n_gpu_layers="auto"))}
    if values.get("flash_attn") == "auto" and values.get("n_gpu_layers") == 0:
        # On the CPU llama.cpp's "auto" turns flash attention on (its CPU backend runs FLASH_ATTN_EXT in every
        # layer): the same numbers, and key, as flash_attn: true. On a GPU the device decides: "auto" stays.
        values = {**values, "flash_attn": True}
    return values


def _resources(options: Any) -> UnitResources:
    # One process; GPU offload puts layers on the visible GPUs (tensor_split spreads them over several).
    gpus = 0 if gpu_layers(options) == 0 else max(1, len([s for s in options.tensor_split or [1.0] if s > 0]))
    return UnitResources(num_cpus=float(options.n_threads or 1), num_gpus=float(gpus))


SPEC = EngineSpec(
    name="llamacpp",
    options_model=LlamaCppOptions,
    model_kind="gguf",
    loader=LlamaCppEngine,
    tokenizer_loader=llamacpp_tokenizer,
    numerics_options=(
        # n_ctx does not change the numbers of a request that fits, but it bounds how many tokens
        # generate() may produce (room = n_ctx - prompt) and whether scoring fails; kept for safety.
        "n_ctx",
        "n_batch",  # also used as n_ubatch: the matmul batch shape, can change the last bits
        "n_gpu_layers",  # GPU kernels round differently from CPU ones
        "tensor_split",  # which device computes which layer
        "flash_attn",  # a different attention kernel: different rounding
        "type_k", "type_v",  # the KV cache's precision (f16 left out of the key: see _effective_numerics)
        # n_threads is left out: ggml's CPU matmuls give each output to one thread (no split-K sums).
    ),
    memory_model=predict_llamacpp,
    describe_hardware=_hardware,
    precision=gguf_precision,
    plan_precision=llamacpp_rules.plan_precision,
    install_hint="pip install 'evalkit[llamacpp]' (llama-cpp-python)",
    capabilities=frozenset(Capability),  # everything, FULL_DISTRIBUTION included (token_distributions)
    resources=_resources,
    package=("llama-cpp-python",),
    context_option="n_ctx",
    label="llama.cpp",
    doctor=_doctor,
    effective_numerics=_effective_numerics,
    warm_imports=("llama_cpp",),
    threads_option="n_threads",
    kv_precision=kv_precision,
    # the info's settings that change greedy outputs (flash_attn, batch shapes, the KV cache it allocated)
    info_numerics=("flash_attn", "n_batch", "n_ubatch", "kv_cache.type_k", "kv_cache.type_v"),
)
