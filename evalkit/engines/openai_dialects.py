"""The served engine's server dialects: one class per kind of server, behind the hooks the engine calls.

- `LlamaServer`: llama-server's own API: `/completion` with token ids in and out (its stream carries each
  token's id), `/tokenize`, `/detokenize` and `/apply-template` for the server's tokenization.
- `VllmServer`: vLLM's `/v1/completions` with `return_token_ids` and `ignore_eos`; `/tokenize` (with
  `messages` for chat) and `/detokenize`. Prompt and next-token log-probabilities (the engine's `score` and
  `next_token_logprobs`) are vLLM's too (`prompt_logprobs` within its max_logprobs, `logprob_token_ids`);
  the capabilities discovery found gate them. llama-server's answer-position distribution is a one-token
  `/completion` with `n_probs`; it has no prompt log-probs.
- `PlainOpenAI`: any other OpenAI-compatible server: `/v1/completions`, text out (no token ids; the engine
  tokenizes the text with the deployment's weights when it has them); log-probs only as the API documents
  them: `logprobs` (top-k keyed by token text) and `echo` (the prompt's tokens with their log-probs).

The engine (`evalkit.engines.openai`) holds no branch on the dialect: what differs is a hook here. Which
dialect a server speaks is found by `evalkit.engines.openai_discovery.discover`.
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.openai_discovery import LLAMA_SERVER_NO_PROMPT, Dialect, ServerFacts
from evalkit.engines.served_http import ServerClient, StreamConsumer
from evalkit.engines.spec import Capability


class Collect(StreamConsumer):
    """One streamed generation: token ids, text, when the first token and the end arrived. The dialect reads
    each event into it (`ServerDialect.feed`)."""

    def __init__(self, dialect: "ServerDialect", arrival: float) -> None:
        self.dialect = dialect
        self.arrival = arrival
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.first: float | None = None
        self.end: float | None = None
        self.finish: str = "length"
        self.stop_reason: Any = None
        self.completion_tokens: int | None = None
        self.decoded: int | None = None  # llama-server: tokens it decoded (its stream may leave some ids out)
        self.done = False

    @property
    def ids_incomplete(self) -> bool:
        """llama-server streams only the token that completes a UTF-8 character (tools/server: process_token sends
        nothing while the text ends inside one, send_partial_response sends `tokens` = that one token): the ids
        of the bytes before it never arrive."""
        return self.decoded is not None and len(self.tokens) < self.decoded

    def tokens_arrived(self, n: int) -> None:
        if n and self.first is None:
            self.first = time.perf_counter()

    def feed(self, data: Any) -> bool:
        return self.dialect.feed(self, data)

    def result(self) -> "Collect":
        return self


def _ids(tokens: list[Any]) -> list[int]:
    """Token ids from a /tokenize answer (llama-server answers {"id", "piece"} objects when asked for pieces)."""
    return [int(t if isinstance(t, int) else t["id"]) for t in tokens]


class ServerDialect:
    """What one kind of server is asked, and how its answers read. The base is the OpenAI completions API
    (`/v1/completions`, server-sent events of `choices`), with vLLM's `/tokenize` and `/detokenize` (the form
    an OpenAI-compatible server that tokenizes at all offers)."""

    name: Dialect = "openai"
    # The server streams the id of the token that stopped a generation (vLLM: always, whatever the token): the
    # engine drops it, as the in-process engines never keep it. False: dropped only when it is an
    # end-of-generation id of the deployment's vocabulary.
    streams_stop_token = False
    # Only text arrives (no token ids): the engine tokenizes the text with the deployment's weights, if any.
    text_only = False
    # next_token_request reads the candidates' log-probs at their ids (vLLM's logprob_token_ids), not from a
    # returned top-k that may leave some out.
    reads_at_ids = False
    # Top-k log-prob lists name token ids (False: the OpenAI API's, keyed by token text, which no id is read from).
    top_k_by_id = True
    # Log-prob requests in flight at once unless the options say (None: max_concurrency).
    scoring_concurrency: int | None = None
    # Settings that change the server's numbers but that it does not expose, with its documented default: what the
    # engine info states for a server evalkit did not launch, so a parity table can name them as suspects.
    unstated_numerics: dict[str, str] = {}

    def __init__(self, client: ServerClient, facts: ServerFacts, cache_prompt: bool = False) -> None:
        self.client, self.facts, self.cache_prompt = client, facts, cache_prompt

    # -- the server's own tokenization ---------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        out = self.client.call("POST", "/tokenize", {"model": self.facts.model_id, "prompt": text,
                                                     "add_special_tokens": add_bos})
        return _ids(out["tokens"])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.client.call("POST", "/detokenize", {"model": self.facts.model_id, "tokens": list(token_ids)})["prompt"])

    def chat_ids(self, prompt: str) -> list[int]:
        out = self.client.call("POST", "/tokenize", {"model": self.facts.model_id, "messages": [{"role": "user", "content": prompt}],
                                                     "add_generation_prompt": True})
        return [int(t) for t in out["tokens"]]

    # -- generation -----------------------------------------------------------------------------------

    def generation_request(self, ids: list[int], req: GenRequest, sampling: SamplingParams, max_tokens: int
                           ) -> tuple[str, dict[str, Any]]:
        """The path and body of one streamed generation of `max_tokens` at most from prompt `ids`."""
        return "/v1/completions", {
            "model": self.facts.model_id, "prompt": ids, "max_tokens": max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "seed": sampling.seed, "stream": True, "stream_options": {"include_usage": True},
        }

    # -- log-probs (what each server documents; the engine's score and next_token_logprobs) ----------------

    def score_request(self, seq: list[int], top_k: int) -> tuple[str, dict[str, Any]]:
        """Teacher-forced log-probs of `seq`: the OpenAI API's `echo` with `logprobs` (the prompt's tokens with
        their log-probs; top-k lists are keyed by token text, so none are kept)."""
        return "/v1/completions", {"model": self.facts.model_id, "prompt": seq, "max_tokens": 1, "temperature": 0.0,
                                   "echo": True, "logprobs": max(1, min(top_k, self.facts.max_logprobs or 1))}

    def read_scores(self, seq: list[int], answer: Any, top_k: int) -> tuple[list[float | None], list[list[tuple[int, float]]] | None]:
        """Each position's log-prob of its actual token (position 0: None) and, when asked and given by id,
        the top-k."""
        lps = answer["choices"][0]["logprobs"]["token_logprobs"]
        if len(lps) < len(seq):
            raise ValueError(f"echo gave {len(lps)} prompt log-probs for {len(seq)} prompt tokens")
        return [None] + [float(x) for x in lps[1:len(seq)]], None

    def next_token_request(self, prompt: list[int], candidates: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        """A one-token completion returning the top `k` log-probs of the answer position (`candidates`: for a
        server that is asked at given ids, `reads_at_ids`)."""
        return "/v1/completions", {"model": self.facts.model_id, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                                   "logprobs": k}

    def read_next_token(self, answer: Any, candidates: Sequence[int], texts: Sequence[str]) -> list[float]:
        """The answer position's log-prob of each candidate (by its token text here); NaN where the returned
        top-k leaves it out."""
        top = answer["choices"][0]["logprobs"]["top_logprobs"][0] or {}
        return [float(top[t]) if t in top else math.nan for t in texts]

    def feed(self, c: Collect, data: Any) -> bool:
        """One stream event into `c`; True at the last one."""
        if data == "[DONE]":
            c.end = c.end or time.perf_counter()
            c.done = True
            return True
        if data.get("usage"):
            c.completion_tokens = int(data["usage"].get("completion_tokens") or 0)
        for choice in data.get("choices") or []:
            toks = choice.get("token_ids") or []
            text = choice.get("text") or ""
            c.tokens_arrived(len(toks) or (1 if text else 0))
            c.tokens.extend(int(t) for t in toks)
            c.text.append(text)
            if choice.get("finish_reason"):
                c.finish = choice["finish_reason"]
                c.stop_reason = choice.get("stop_reason")
                c.end = time.perf_counter()
        return False

    def unstreamed(self, c: Collect, whole: Any) -> None:
        """The answer to a generation asked again without streaming (`Collect.ids_incomplete`) into `c`."""
        raise NotImplementedError(f"a {self.name} server's stream leaves no token ids out")


class PlainOpenAI(ServerDialect):
    """Any other OpenAI-compatible server: text out, no token ids."""

    name: Dialect = "openai"
    text_only = True
    top_k_by_id = False


class VllmServer(ServerDialect):
    """vLLM's OpenAI server, with its extensions: token ids out, ignore_eos."""

    name: Dialect = "vllm"
    streams_stop_token = True
    reads_at_ids = True

    def generation_request(self, ids: list[int], req: GenRequest, sampling: SamplingParams, max_tokens: int
                           ) -> tuple[str, dict[str, Any]]:
        path, body = super().generation_request(ids, req, sampling, max_tokens)
        return path, body | {"ignore_eos": req.ignore_eos, "return_token_ids": True, "skip_special_tokens": True}

    def score_request(self, seq: list[int], top_k: int) -> tuple[str, dict[str, Any]]:
        # prompt_logprobs: the actual token's log-prob always, plus the top_k (<= the server's max_logprobs).
        return "/v1/completions", {"model": self.facts.model_id, "prompt": seq, "max_tokens": 1, "temperature": 0.0,
                                   "prompt_logprobs": top_k}

    def read_scores(self, seq: list[int], answer: Any, top_k: int) -> tuple[list[float | None], list[list[tuple[int, float]]] | None]:
        lps = answer["choices"][0].get("prompt_logprobs") or []
        logprobs: list[float | None] = [None] * len(seq)
        top: list[list[tuple[int, float]]] | None = [[] for _ in seq] if top_k else None
        for pos in range(1, len(seq)):
            entry = lps[pos] if pos < len(lps) else None
            if not entry:
                raise ValueError(f"no prompt log-prob at position {pos}")
            logprobs[pos] = float(entry[str(seq[pos])]["logprob"])
            if top is not None:
                best = [(int(t), float(v["logprob"])) for t, v in entry.items() if v.get("rank") is not None and v["rank"] <= top_k]
                top[pos] = sorted(best, key=lambda e: -e[1])
        return logprobs, top

    def next_token_request(self, prompt: list[int], candidates: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        """vLLM's `logprob_token_ids`: the whole-vocabulary log-softmax read at the candidates, as in-process."""
        return "/v1/completions", {"model": self.facts.model_id, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                                   "logprobs": 1, "logprob_token_ids": list(map(int, candidates)),
                                   "return_tokens_as_token_ids": True}

    def read_next_token(self, answer: Any, candidates: Sequence[int], texts: Sequence[str]) -> list[float]:
        first = answer["choices"][0]["logprobs"]["top_logprobs"][0]
        by_id = {int(k.split(":", 1)[1]): float(v) for k, v in first.items()}
        return [by_id[int(c)] if int(c) in by_id else math.nan for c in candidates]


class LlamaServer(ServerDialect):
    """llama-server's own API (`/completion`, `/tokenize`, `/detokenize`, `/apply-template`)."""

    name: Dialect = "llama.cpp"
    # One at a time, as in-process llama.cpp scores: llama-server's slots (4 by default) batch concurrent
    # requests together, which changes its numbers. Measured on SmolLM2-135M Q4_1, 60 MMLU items, llama-server
    # with its defaults: 16 in flight: 55/60 letters as in-process, log-probs up to 0.2 apart (median 0.05);
    # one at a time: 60/60, within 1.2e-4.
    scoring_concurrency = 1
    # Neither /props nor /slots says whether flash attention runs; `llama-server --help`: -fa defaults to auto.
    unstated_numerics = {"flash_attn": "not stated by llama-server (its default -fa auto: on for a CPU)"}

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        out = self.client.call("POST", "/tokenize", {"content": text, "add_special": add_bos, "parse_special": False})
        return _ids(out["tokens"])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.client.call("POST", "/detokenize", {"tokens": list(token_ids)})["content"])

    def chat_ids(self, prompt: str) -> list[int]:
        text = self.client.call("POST", "/apply-template", {"messages": [{"role": "user", "content": prompt}]})["prompt"]
        out = self.client.call("POST", "/tokenize", {"content": text, "add_special": True, "parse_special": True})
        return drop_double_bos(_ids(out["tokens"]))

    def generation_request(self, ids: list[int], req: GenRequest, sampling: SamplingParams, max_tokens: int
                           ) -> tuple[str, dict[str, Any]]:
        return "/completion", {
            "prompt": ids, "n_predict": max_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
            # As the in-process engine samples: no top-k, min-p or repetition penalty.
            "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, "seed": sampling.seed, "ignore_eos": req.ignore_eos,
            "stream": True, "return_tokens": True, "cache_prompt": self.cache_prompt, "n_probs": 0,
        }

    def feed(self, c: Collect, data: Any) -> bool:
        # /completion: {"content", "tokens", "stop", "stop_type", ...}
        toks = data.get("tokens") or []
        c.tokens_arrived(len(toks))
        c.tokens.extend(int(t) for t in toks)
        c.text.append(data.get("content") or "")
        if data.get("tokens_predicted") is not None:
            c.decoded = int(data["tokens_predicted"])
        if data.get("stop"):
            c.finish = {"eos": "stop", "word": "stop", "limit": "length"}.get(data.get("stop_type"), "length")
            c.end = time.perf_counter()
            c.done = True
            return True
        return False

    def score_request(self, seq: list[int], top_k: int) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError(LLAMA_SERVER_NO_PROMPT)

    def next_token_request(self, prompt: list[int], candidates: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        # n_probs with post_sampling_probs false: the top k of the softmax of the raw logits (before any
        # sampler), llama.cpp's tools/server get_token_probabilities.
        return "/completion", {"prompt": prompt, "n_predict": 1, "n_probs": k, "post_sampling_probs": False,
                               "temperature": 0.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                               "cache_prompt": self.cache_prompt, "stream": False}

    def read_next_token(self, answer: Any, candidates: Sequence[int], texts: Sequence[str]) -> list[float]:
        top = answer["completion_probabilities"][0]["top_logprobs"]
        by_id = {int(e["id"]): float(e["logprob"]) for e in top}
        return [by_id[int(c)] if int(c) in by_id else math.nan for c in candidates]

    def unstreamed(self, c: Collect, whole: Any) -> None:
        c.tokens = [int(t) for t in whole.get("tokens") or []]
        c.text = [str(whole.get("content") or "")]


DIALECTS: dict[Dialect, type[ServerDialect]] = {"llama.cpp": LlamaServer, "vllm": VllmServer, "openai": PlainOpenAI}


def dialect_for(client: ServerClient, facts: ServerFacts, cache_prompt: bool = False) -> ServerDialect:
    """The dialect of the server discovery described."""
    return DIALECTS[facts.dialect](client, facts, cache_prompt)


def drop_double_bos(ids: list[int]) -> list[int]:
    # A template that writes BOS itself, tokenized with add_special, starts with two; the in-process engine
    # adds none then (see LlamaCppEngine.prompt_token_ids).
    return ids[1:] if len(ids) >= 2 and ids[0] == ids[1] else ids


class ServerTokens:
    """Tokenization by the server itself (no weights named), in its dialect: llama-server's /tokenize and
    /apply-template, vLLM's /tokenize (with messages for chat)."""

    def __init__(self, dialect: ServerDialect, chat_template: str) -> None:
        self.dialect = dialect
        self.use_chat = chat_template == "auto" and Capability.CHAT_TEMPLATE in dialect.facts.capabilities

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self.dialect.tokenize(text, add_bos)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.dialect.detokenize(token_ids)

    def chat_ids(self, prompt: str) -> list[int]:
        return self.dialect.chat_ids(prompt)

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if request.chat and self.use_chat:
            return self.chat_ids(request.prompt)
        return self.tokenize(request.prompt, add_bos=True)

    def prompt_format(self, request: GenRequest) -> str:
        return "chat" if request.chat and self.use_chat and request.prompt_token_ids is None else "completion"
