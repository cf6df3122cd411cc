"""The one small interface every engine implements. An engine runs requests; it never knows which suite asked."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np


def utc_now() -> str:
    """Now in UTC, ISO 8601 to the second: when a result was measured."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int = 0


@dataclass(frozen=True)
class GenRequest:
    """One generation. `chat=True` applies the model's chat template when it has one."""

    key: str
    prompt: str
    chat: bool = True
    max_tokens: int | None = None  # overrides SamplingParams.max_tokens for this request
    prompt_token_ids: tuple[int, ...] | None = None  # exact tokens; bypasses templating when given
    ignore_eos: bool = False  # generate up to max_tokens past end-of-generation (the cost suite's fixed lengths)


@dataclass(frozen=True)
class GenResult:
    key: str
    prompt_token_ids: list[int]
    output_text: str
    output_token_ids: list[int]
    prompt_format: str  # "chat" or "completion"
    finish_reason: str
    ttft_s: float | None
    total_s: float
    # Provenance (records carry it): served from the result cache, and when the engine produced it (UTC ISO
    # time, stamped when the result is made; a cache hit keeps the stored time, None only for an entry stored
    # before entries carried one). Not part of equality: a cached result equals the fresh one.
    cached: bool = field(default=False, compare=False)
    measured_at: str | None = field(default_factory=utc_now, compare=False)


@dataclass(frozen=True)
class TokenScores:
    """Log-probabilities of a token sequence under the model.

    `logprobs[i]` is log p(token_ids[i] | token_ids[:i]) for i >= 1 (index 0 has no context: None).
    `top[i]` is the model's top-k (token id, logprob) at position i (predicting token i), when asked for.
    `tail[i]` is log of the probability mass outside top-k (None when the engine cannot say).
    """

    token_ids: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[int, float]]] | None = None
    cached: bool = field(default=False, compare=False)  # as GenResult's
    measured_at: str | None = field(default_factory=utc_now, compare=False)


@dataclass(frozen=True)
class Provenance:
    """Where one engine result's numbers come from, for results that cannot carry it themselves (the plain
    lists of `next_token_logprobs` and `score_span`): served from the result cache, and when measured."""

    cached: bool
    measured_at: str | None  # None only for a cache entry stored before entries carried the time


@dataclass(frozen=True)
class EngineInfo:
    engine: str
    engine_version: str
    model_path: str
    add_bos: bool
    bos_token_id: int | None
    chat_template: str | None  # name/source of the chat template used, None for plain completion
    vocab_size: int
    n_ctx: int
    load_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    # The most top-k log-probs per position `score` / `score_span` give (None: any; a served engine: the
    # server's limit, e.g. vLLM's --max-logprobs). Suites ask for no more (perplexity's top-k bound).
    top_k_limit: int | None = None
    # How `next_token_logprobs` reads its candidates: "one-pass" (the whole distribution, at the ids) or
    # "answer-top-k" (from the answer position's top-k a server returned; NaN for a candidate outside it).
    next_token_method: str = "one-pass"


class Engine(ABC):
    """A loaded model. Lives inside one worker process; `close()` frees it."""

    name: str = "engine"

    @abstractmethod
    def info(self) -> EngineInfo: ...

    @abstractmethod
    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        """Token ids of `text`; `add_bos` prepends BOS when the model uses one."""

    @abstractmethod
    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    @abstractmethod
    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        """The exact tokens this engine will feed for `request` (chat template and BOS applied)."""

    @abstractmethod
    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        """Run all requests (batched where the engine can); yields one result per request.

        An engine may hand results out only after the whole batch, to keep timings honest.
        `ttft_s` / `total_s` are measured from the moment this call started (all requests arrive together).
        """

    @abstractmethod
    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        """Log-probabilities of each given token sequence (teacher forcing, one pass each)."""

    @abstractmethod
    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        """For each prompt, full-vocabulary log-softmax at the last position, read at `candidates`."""

    def score_span(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
        """Teacher-forced NLL and top-k `[[id, logprob], ...]` (highest first) for every position p >= first
        of `token_ids`, each predicted from token_ids[:p] (one pass; `first` >= 1).

        This default slices `score` (top-k at every position); engines with a cheaper way override it.
        """
        scores = self.score([list(token_ids)], top_k=top_k)[0]
        scored = scores.logprobs[first:len(token_ids)]
        if any(lp is None for lp in scored):  # only position 0 has no log-prob
            raise ValueError(f"score() left a log-prob out after position {first}")
        nll = [-float(lp) for lp in scored if lp is not None]
        assert scores.top is not None or top_k == 0
        top = [
            [[int(t), float(lp)] for t, lp in sorted(scores.top[p], key=lambda e: -e[1])] if scores.top is not None else []
            for p in range(first, len(token_ids))
        ]
        return nll, top

    def score_span_arrays(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`score_span` as arrays: the NLL (float64, one per position), the top-k ids (int64, positions x top_k,
        -1 where a position holds fewer) and their log-probs (float64, -inf there), highest first. Engines
        whose scores arrive as arrays override it and skip the per-position lists."""
        nll, top = self.score_span(token_ids, first, top_k)
        ids = np.full((len(nll), top_k), -1, dtype=np.int64)
        lps = np.full((len(nll), top_k), -np.inf)
        for i, row in enumerate(top):
            if row:
                a = np.asarray(row, dtype=np.float64)[:top_k]
                ids[i, : len(a)], lps[i, : len(a)] = a[:, 0], a[:, 1]
        return np.asarray(nll, dtype=np.float64), ids, lps

    def token_distributions(self, token_ids: Sequence[int], first: int) -> Iterator[tuple[int, np.ndarray]]:
        """Teacher-forced, one forward pass over token_ids (len <= n_ctx): the full-vocabulary log-softmax
        (float32) for every position p >= first (>= 1) predicting token_ids[p], yielded in blocks
        (start_p, array[n, vocab]) whose row j is position start_p + j.

        Only engines with the FULL_DISTRIBUTION capability implement it.
        """
        raise NotImplementedError(f"engine {self.name!r} cannot give full next-token distributions")

    # -- wrappers (result cache, lazy loading) answer these; a plain engine has no cache -------------

    def uncached(self) -> "Engine":
        """The engine that computes fresh results, underneath any result cache: for work whose timings
        are the point (the cost suite). A lazily loaded engine loads on its first model call."""
        return self

    def prepare_for_timing(self) -> bool:
        """Called before timed measurements (the cost suite): the engine does now what a later call would
        otherwise do inside a timing, and says whether one unrecorded batch of each timed shape should still
        run first: yes, unless it knows that nothing of a shape's first call is left to happen (no compile or
        graph capture per shape, weights and buffers in memory already)."""
        return True

    def measurement(self, kind: str, payload: Mapping[str, Any]) -> Any | None:
        """A whole measurement stored by an earlier run of this deployment (None: none, or no cache)."""
        return None

    def store_measurement(self, kind: str, payload: Mapping[str, Any], value: Any) -> None:
        """Keep a whole measurement for later runs (a plain engine has nowhere to keep it)."""

    def last_call_provenance(self) -> Sequence[Provenance] | None:
        """Provenance of each result of this engine's latest `score`, `next_token_logprobs` or `score_span`
        call, in result order; None: this engine has no result cache, so the call computed every result.
        (GenResult and TokenScores also carry their own `cached` / `measured_at`.)"""
        return None

    def run_stats(self) -> dict[str, Any]:
        """What this run's engine calls cost, for the run's engine description (cache hits, whether a
        lazily loaded engine loaded at all); empty for a plain engine."""
        return {}

    def close(self) -> None:
        """Release the model. Worker processes exit afterwards anyway."""


# -- what in-process engines share ------------------------------------------------------------------


class _Tokens(Protocol):
    def prompt_token_ids(self, request: GenRequest) -> list[int]: ...

    def prompt_format(self, request: GenRequest) -> str: ...  # "chat" (template applied) or "completion"

    def detokenize(self, token_ids: Sequence[int]) -> str: ...


def generate_in_turn(
    engine: _Tokens,
    requests: Sequence[GenRequest],
    sampling: SamplingParams,
    context: int,
    sample: Callable[[list[int]], Iterable[int]],
    is_end: Callable[[int], bool],
) -> Iterator[GenResult]:
    """Requests one after another through one model context (llama.cpp and hf in-process): the stopping
    rules and the result every such engine gives.

    `sample(prompt_ids)` streams one request's sampled tokens (the engine resets and seeds its own state
    there; it is not resumed after the last token wanted). Generation stops at an end-of-generation token
    (`is_end`, not kept; ignored with `ignore_eos`), at the request's max_tokens, or when `context` tokens
    (prompt included) are used. `ttft_s` / `total_s` are measured from this call's start: all requests
    arrive together and each waits for those before it.
    """
    arrival = time.perf_counter()
    for req in requests:
        tokens = engine.prompt_token_ids(req)
        max_tokens = req.max_tokens or sampling.max_tokens
        room = context - len(tokens)
        out: list[int] = []
        ttft: float | None = None
        finish = "length"
        if not tokens:
            finish = "empty_prompt"
        elif room <= 0:
            finish = "prompt_too_long"
        else:
            for tok in sample(tokens):
                if ttft is None:
                    ttft = time.perf_counter() - arrival
                if not req.ignore_eos and is_end(tok):
                    finish = "stop"
                    break
                out.append(tok)
                if len(out) >= min(max_tokens, room):
                    break
        yield GenResult(
            key=req.key,
            prompt_token_ids=tokens,
            output_text=engine.detokenize(out),
            output_token_ids=out,
            prompt_format=engine.prompt_format(req),
            finish_reason=finish,
            ttft_s=ttft,
            total_s=time.perf_counter() - arrival,
        )
