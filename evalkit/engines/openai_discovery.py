"""What an OpenAI-compatible server can do, asked rather than assumed (`discover`): the models it serves, which
dialect it speaks (llama.cpp's own `/completion` with token ids out; vLLM's `/v1/completions` with
`prompt_logprobs`, `logprob_token_ids` and `return_token_ids`; a plain OpenAI API), `/tokenize`, the top-k it
allows (`max_logprobs`) and its chat template. What a dialect's requests and streams look like is in
`evalkit.engines.openai_dialects`; the engine is `evalkit.engines.openai`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from evalkit.engines.served_http import ServedRequestError, ServerClient
from evalkit.engines.spec import Capability
from evalkit.errors import ConfigError

Dialect = Literal["llama.cpp", "vllm", "openai"]
MAX_TOP_K = 2000  # what evalkit asks of a server it starts (vLLM --max-logprobs), as the in-process engine

NO_FULL = "a server sends no full next-token distributions"
LLAMA_SERVER_NO_PROMPT = ("llama-server gives log-probs only for generated tokens (n_probs) and refuses echo "
                          "('Only no echo is supported'): the log-prob of each token of a given text (teacher-forced "
                          "scoring) is not available from it")
LLAMA_SERVER_MISSING = {
    Capability.PROMPT_LOGPROBS: LLAMA_SERVER_NO_PROMPT,
    Capability.FULL_DISTRIBUTION: NO_FULL,
}
VLLM_MISSING = {Capability.FULL_DISTRIBUTION: NO_FULL}
# The OpenAI completions API documents `logprobs` up to 5 (the most likely tokens per position).
OPENAI_DOCUMENTED_LOGPROBS = 5
_LIMIT = re.compile(r"(?:max allowed|max_logprobs|maximum)[^0-9]{0,20}(\d+)", re.IGNORECASE)


@dataclass
class ServerFacts:
    """What discovery learned about one server (recorded in the engine description and the manifest)."""

    dialect: Dialect
    model_id: str
    models: list[str]
    version: str | None
    capabilities: frozenset[Capability]
    reasons: dict[Capability, str]
    identity: dict[str, Any] = field(default_factory=dict)  # server-reported: the cache key without weights
    max_logprobs: int | None = None  # the most log-probs per position the server gives (its limit, read)
    n_ctx: int | None = None
    vocab_size: int | None = None
    chat_template: str | None = None
    total_slots: int | None = None
    # How each kind of log-prob is asked of this server (the engine's score / next_token_logprobs), in words
    # for the engine description and the report: e.g. "prompt_logprobs (top-k <= 20)".
    methods: dict[str, str] = field(default_factory=dict)

    # Where these facts were read: "plan" (the run's plan-time discovery, handed to its workers) or "engine"
    # (the engine asked the server itself: a server it launched, or a worker the plan's facts did not reach).
    probed_at: str = "engine"

    def describe(self) -> dict[str, Any]:
        return {"dialect": self.dialect, "model_id": self.model_id, "models": self.models, "version": self.version,
                "capabilities": sorted(c.value for c in self.capabilities),
                "missing": {c.value: r for c, r in self.reasons.items()}, "max_logprobs": self.max_logprobs,
                "n_ctx": self.n_ctx, "total_slots": self.total_slots, "methods": self.methods, "identity": self.identity,
                "probed_at": self.probed_at}

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON (`from_json` reads it back): how a run's plan-time discovery reaches its workers."""
        return {**self.describe(), "vocab_size": self.vocab_size, "chat_template": self.chat_template}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ServerFacts":
        return cls(d["dialect"], d["model_id"], list(d["models"]), d.get("version"),
                   frozenset(Capability(c) for c in d["capabilities"]),
                   {Capability(c): str(r) for c, r in (d.get("missing") or {}).items()}, dict(d.get("identity") or {}),
                   max_logprobs=d.get("max_logprobs"), n_ctx=d.get("n_ctx"), vocab_size=d.get("vocab_size"),
                   chat_template=d.get("chat_template"), total_slots=d.get("total_slots"),
                   methods=dict(d.get("methods") or {}), probed_at=str(d.get("probed_at") or "engine"))



def discover(client: ServerClient, served_model: str | None, where: str, top_k: int = MAX_TOP_K) -> ServerFacts:
    """Ask the server what it serves and can do. Raises ConfigError (one line) for an unreachable server, a
    refused API key or a model it does not serve."""
    try:
        listing = client.call("GET", "/v1/models")
    except ServedRequestError as e:
        if e.status in (401, 403):
            raise ConfigError(where, f"{client.base_url} refused the API key (HTTP {e.status})") from None
        raise ConfigError(where, f"cannot reach an OpenAI-compatible server at {client.base_url} ({e})") from None
    models = [str(m.get("id")) for m in listing.get("data", []) if isinstance(m, dict)]
    if not models:
        raise ConfigError(where, f"{client.base_url}/models lists no model")
    model_id = served_model or models[0]
    if model_id not in models:
        raise ConfigError(where, f"served_model {model_id!r} is not served at {client.base_url} (it serves: {', '.join(models)})")
    meta: dict[str, Any] = next((m for m in listing["data"] if m.get("id") == model_id), {})
    props = _optional(client, "GET", "/props")
    if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
        return _llama_server_facts(client, model_id, models, props, meta)
    version = _optional(client, "GET", "/version")
    if isinstance(version, dict) and "version" in version:
        return _vllm_facts(client, model_id, models, str(version["version"]), meta, top_k)
    return _plain_facts(client, model_id, models, meta)


def read_limit(error: str) -> int | None:
    """The limit a server's refusal names ("... which is greater than max allowed: 20"); None if it names none."""
    found = _LIMIT.search(error)
    return int(found.group(1)) if found else None


def _optional(client: ServerClient, method: str, path: str, body: Any = None) -> Any:
    try:
        return client.call(method, path, body)
    except ServedRequestError:
        return None


def _llama_server_facts(client: ServerClient, model_id: str, models: list[str], props: dict[str, Any],
                        meta: dict[str, Any]) -> ServerFacts:
    caps = {Capability.GENERATE}
    reasons = dict(LLAMA_SERVER_MISSING)
    tok = _optional(client, "POST", "/tokenize", {"content": "a"})
    if isinstance(tok, dict) and isinstance(tok.get("tokens"), list):
        caps.add(Capability.TOKENIZER)
    else:
        reasons[Capability.TOKENIZER] = "llama-server's /tokenize did not answer"
    template = props.get("chat_template") or None
    if template:
        caps.add(Capability.CHAT_TEMPLATE)
    else:
        reasons[Capability.CHAT_TEMPLATE] = "llama-server reports no chat template"
    settings = props.get("default_generation_settings") or {}
    model_meta = meta.get("meta") or {}
    n_vocab = model_meta.get("n_vocab")
    # The answer position's distribution: a one-token completion with n_probs gives the top n_probs of the
    # pre-sampling softmax (post_sampling_probs false); llama-server caps n_probs only at the vocabulary.
    probe = _optional(client, "POST", "/completion", {"prompt": [int(t) for t in (tok or {}).get("tokens", [1])] or [1],
                                                      "n_predict": 1, "n_probs": 2, "temperature": 0.0,
                                                      "post_sampling_probs": False, "cache_prompt": False})
    probs = (probe or {}).get("completion_probabilities") if isinstance(probe, dict) else None
    methods: dict[str, str] = {"prompt_logprobs": "none (llama-server has no prompt log-probs)"}
    if probs and isinstance(probs, list) and probs[0].get("top_logprobs") is not None:
        caps.add(Capability.NEXT_TOKEN_LOGPROBS)
        methods["next_token"] = (f"one-token /completion with n_probs (pre-sampling softmax; top-k <= the "
                                 f"vocabulary, {n_vocab or '?'})")
    else:
        reasons[Capability.NEXT_TOKEN_LOGPROBS] = "llama-server's /completion gave no n_probs log-probs"
    identity = {"build_info": props.get("build_info"), "model_path": props.get("model_path"), "model_meta": model_meta,
                "total_slots": props.get("total_slots")}
    return ServerFacts("llama.cpp", model_id, models, props.get("build_info"), frozenset(caps), reasons, identity,
                       max_logprobs=n_vocab, n_ctx=settings.get("n_ctx"), vocab_size=n_vocab,
                       chat_template=template, total_slots=props.get("total_slots"), methods=methods)


def _vllm_facts(client: ServerClient, model_id: str, models: list[str], version: str, meta: dict[str, Any],
                top_k: int) -> ServerFacts:
    caps = {Capability.GENERATE}
    reasons = dict(VLLM_MISSING)
    tok = _optional(client, "POST", "/tokenize", {"model": model_id, "prompt": "a"})
    ids = tok.get("tokens") if isinstance(tok, dict) else None
    if isinstance(ids, list) and ids:
        caps.add(Capability.TOKENIZER)
    else:
        reasons[Capability.TOKENIZER] = "vLLM's /tokenize did not answer"
        ids = [0]
    chat = _optional(client, "POST", "/tokenize", {"model": model_id, "add_generation_prompt": True,
                                                   "messages": [{"role": "user", "content": "a"}]})
    if isinstance(chat, dict) and chat.get("tokens"):
        caps.add(Capability.CHAT_TEMPLATE)
    else:
        reasons[Capability.CHAT_TEMPLATE] = "vLLM could not apply a chat template (/tokenize with messages failed)"
    # Prompt log-probs: first whether there are any (k = 0: the actual token's alone), then the server's top-k
    # limit (--max-logprobs, 20 unless set), read from its refusal of more: never more is asked of it.
    max_logprobs: int | None = None
    methods: dict[str, str] = {}
    probe = {"model": model_id, "prompt": list(ids) + list(ids), "max_tokens": 1, "temperature": 0.0}
    try:
        client.call("POST", "/v1/completions", {**probe, "prompt_logprobs": 0})
        caps.add(Capability.PROMPT_LOGPROBS)
    except ServedRequestError as e:
        reasons[Capability.PROMPT_LOGPROBS] = f"vLLM refused prompt_logprobs ({e})"
    if Capability.PROMPT_LOGPROBS in caps:
        try:
            client.call("POST", "/v1/completions", {**probe, "prompt_logprobs": top_k})
            max_logprobs = top_k
        except ServedRequestError as e:
            max_logprobs = read_limit(str(e))
            if max_logprobs is None:
                max_logprobs = 0  # the actual token's log-prob only: a limit it did not say
        methods["prompt_logprobs"] = f"prompt_logprobs (the actual token + top-k <= {max_logprobs}, vLLM max_logprobs)"
    try:
        client.call("POST", "/v1/completions", {**probe, "logprobs": 1, "logprob_token_ids": [int(ids[0])]})
        caps.add(Capability.NEXT_TOKEN_LOGPROBS)
        methods["next_token"] = "logprob_token_ids (whole-vocabulary log-softmax read at the ids)"
    except ServedRequestError as e:
        reasons[Capability.NEXT_TOKEN_LOGPROBS] = f"vLLM refused logprob_token_ids ({e})"
    for c in caps:
        reasons.pop(c, None)
    identity = {"vllm_version": version, "model": meta, "max_model_len": meta.get("max_model_len"),
                "root": meta.get("root")}
    return ServerFacts("vllm", model_id, models, f"vllm {version}", frozenset(caps), reasons, identity,
                       max_logprobs=max_logprobs, n_ctx=meta.get("max_model_len"), methods=methods)


def _plain_facts(client: ServerClient, model_id: str, models: list[str], meta: dict[str, Any]) -> ServerFacts:
    """A server with no dialect of its own: only what the OpenAI completions API documents. `logprobs` (top
    log-probs per position, keyed by token text) and `echo` (the prompt's tokens with their log-probs) are
    probed; the top-k limit is the server's refusal's number, or the documented 5."""
    caps = {Capability.GENERATE}
    reasons = {c: "a plain OpenAI-compatible server gives no token ids, tokenizer or full distributions"
               for c in (Capability.TOKENIZER, Capability.CHAT_TEMPLATE, Capability.FULL_DISTRIBUTION)}
    methods: dict[str, str] = {}
    probe = {"model": model_id, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0}
    limit: int | None = None
    for k in (20, OPENAI_DOCUMENTED_LOGPROBS, 1):
        try:
            answer = client.call("POST", "/v1/completions", {**probe, "logprobs": k, "echo": True})
        except ServedRequestError as e:
            said = read_limit(str(e))
            if said is not None and said < k:
                limit = said
            continue
        limit = k if limit is None else min(limit, k)
        lps = ((answer.get("choices") or [{}])[0].get("logprobs") or {}) if isinstance(answer, dict) else {}
        if isinstance(lps.get("top_logprobs"), list) and lps["top_logprobs"]:
            caps.add(Capability.NEXT_TOKEN_LOGPROBS)
            methods["next_token"] = f"one-token completion with logprobs (top-{limit} by token text)"
        if isinstance(lps.get("token_logprobs"), list) and len(lps["token_logprobs"]) >= 3:
            caps.add(Capability.PROMPT_LOGPROBS)
            methods["prompt_logprobs"] = "echo with logprobs (the actual token's log-prob; top-k by text, no ids)"
        break
    if Capability.NEXT_TOKEN_LOGPROBS not in caps:
        reasons[Capability.NEXT_TOKEN_LOGPROBS] = "the server's /v1/completions answered no logprobs"
    if Capability.PROMPT_LOGPROBS not in caps:
        reasons[Capability.PROMPT_LOGPROBS] = "the server's /v1/completions gave no prompt log-probs (echo with logprobs)"
    return ServerFacts("openai", model_id, models, None, frozenset(caps), reasons, identity={"model": meta},
                       max_logprobs=limit, methods=methods)


# Capabilities of a server evalkit starts itself, known before it starts (checked again once it runs).
LAUNCHED_CAPS: dict[str, tuple[frozenset[Capability], dict[Capability, str]]] = {
    "llama-server": (frozenset({Capability.GENERATE, Capability.TOKENIZER, Capability.CHAT_TEMPLATE,
                                Capability.NEXT_TOKEN_LOGPROBS}), LLAMA_SERVER_MISSING),
    "vllm": (frozenset(Capability) - {Capability.FULL_DISTRIBUTION}, VLLM_MISSING),
}
