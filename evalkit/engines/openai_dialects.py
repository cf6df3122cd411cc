"""The served engine's server dialects: one class per kind of server, behind the hooks the engine calls.

- `LlamaServer`: llama-server's own API: `/completion` with token ids in and out (its stream carries each
  token's id), `/tokenize`, `/detokenize` and `/apply-template` for the server's tokenization.
- `VllmServer`: vLLM's `/v1/completions` with `return_token_ids` and `ignore_eos`; `/tokenize` (with
  `messages` for chat) and `/detokenize`. Prompt and next-token log-probabilities (the engine's `score` and
  `next_token_logprobs`) are vLLM's too; the capabilities discovery found gate them.
- `PlainOpenAI`: any other OpenAI-compatible server: `/v1/completions`, text out (no token ids; the engine
  tokenizes the text with the deployment's weights when it has them).

The engine (`evalkit.engines.openai`) holds no branch on the dialect: what differs is a hook here. Which
dialect a server speaks is found by `evalkit.engines.openai_discovery.discover`.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.openai_discovery import Dialect, ServerFacts
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


class VllmServer(ServerDialect):
    """vLLM's OpenAI server, with its extensions: token ids out, ignore_eos."""

    name: Dialect = "vllm"
    streams_stop_token = True

    def generation_request(self, ids: list[int], req: GenRequest, sampling: SamplingParams, max_tokens: int
                           ) -> tuple[str, dict[str, Any]]:
        path, body = super().generation_request(ids, req, sampling, max_tokens)
        return path, body | {"ignore_eos": req.ignore_eos, "return_token_ids": True, "skip_special_tokens": True}


class LlamaServer(ServerDialect):
    """llama-server's own API (`/completion`, `/tokenize`, `/detokenize`, `/apply-template`)."""

    name: Dialect = "llama.cpp"

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
