"""The served engine's dialects (evalkit/engines/openai_dialects.py) without a server: what each asks a server
and how it reads the answers. The served tests (test_served.py, test_served_vllm.py) run them against real
llama-server and vLLM servers; these pin the request bodies and stream parsing one dialect at a time."""
from __future__ import annotations

from typing import Any

import pytest

from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.openai_dialects import Collect, LlamaServer, PlainOpenAI, ServerTokens, VllmServer, dialect_for
from evalkit.engines.openai_discovery import ServerFacts
from evalkit.engines.spec import Capability


class Client:
    """Records every call; answers /tokenize, /detokenize and /apply-template as the servers do."""

    base_url = "http://stub"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if path == "/tokenize":
            # llama-server may answer {"id", "piece"} objects; vLLM plain ids
            return {"tokens": [1, {"id": 1, "piece": "<s>"}, 7] if "content" in body else [5, 6]}
        if path == "/detokenize":
            return {"content": "llama text", "prompt": "vllm text"}
        if path == "/apply-template":
            return {"prompt": "<s>user: hi"}
        raise AssertionError(path)


def facts(dialect: Any) -> ServerFacts:
    return ServerFacts(dialect, "m", ["m"], "1", frozenset(Capability), {})


SAMPLING = SamplingParams(temperature=0.5, top_p=0.9, max_tokens=11, seed=3)


def test_each_dialect_is_its_own_class() -> None:
    client = Client()
    assert isinstance(dialect_for(client, facts("llama.cpp")), LlamaServer)
    assert isinstance(dialect_for(client, facts("vllm")), VllmServer)
    assert isinstance(dialect_for(client, facts("openai")), PlainOpenAI)
    assert VllmServer.streams_stop_token and not LlamaServer.streams_stop_token and not PlainOpenAI.streams_stop_token
    assert PlainOpenAI.text_only and not VllmServer.text_only and not LlamaServer.text_only


def test_generation_requests() -> None:
    req = GenRequest("k", "p", ignore_eos=True)
    path, body = LlamaServer(Client(), facts("llama.cpp"), cache_prompt=True).generation_request([1, 2], req, SAMPLING, 7)
    assert path == "/completion" and body == {
        "prompt": [1, 2], "n_predict": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
        "repeat_penalty": 1.0, "seed": 3, "ignore_eos": True, "stream": True, "return_tokens": True,
        "cache_prompt": True, "n_probs": 0}
    common = {"model": "m", "prompt": [1, 2], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stream": True,
              "stream_options": {"include_usage": True}}
    assert PlainOpenAI(Client(), facts("openai")).generation_request([1, 2], req, SAMPLING, 7) == ("/v1/completions", common)
    assert VllmServer(Client(), facts("vllm")).generation_request([1, 2], req, SAMPLING, 7) == (
        "/v1/completions", {**common, "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": True})


def test_llama_server_stream_and_unstreamed_answer() -> None:
    c = Collect(LlamaServer(Client(), facts("llama.cpp")), 0.0)
    assert not c.feed({"content": "He", "tokens": [5, 6], "tokens_predicted": 2})
    assert not c.feed({"content": "", "tokens": []})
    assert c.feed({"content": "llo", "tokens": [7], "tokens_predicted": 4, "stop": True, "stop_type": "eos"})
    assert (c.tokens, "".join(c.text), c.finish, c.done, c.decoded) == ([5, 6, 7], "Hello", "stop", True, 4)
    assert c.ids_incomplete and c.first is not None and c.end is not None  # 4 decoded, 3 ids streamed
    c.dialect.unstreamed(c, {"tokens": [5, 6, 8, 7], "content": "Hello"})
    assert c.tokens == [5, 6, 8, 7] and c.text == ["Hello"] and not c.ids_incomplete


@pytest.mark.parametrize("cls,dialect", [(VllmServer, "vllm"), (PlainOpenAI, "openai")])
def test_openai_stream(cls: Any, dialect: str) -> None:
    c = Collect(cls(Client(), facts(dialect)), 0.0)
    events = [{"choices": [{"text": "a", "token_ids": [1]}]}, {"choices": [{"text": "b"}]},
              {"choices": [{"text": "", "token_ids": [2], "finish_reason": "stop", "stop_reason": None}]},
              {"usage": {"completion_tokens": 3}, "choices": []}]
    assert not any(c.feed(e) for e in events) and c.feed("[DONE]")
    assert (c.tokens, "".join(c.text), c.finish, c.stop_reason, c.completion_tokens, c.done) == ([1, 2], "ab", "stop", None, 3, True)
    with pytest.raises(NotImplementedError):
        c.dialect.unstreamed(c, {})


def test_server_tokenization_per_dialect() -> None:
    llama = Client()
    tokens = ServerTokens(LlamaServer(llama, facts("llama.cpp")), "auto")
    assert tokens.tokenize("x", add_bos=True) == [1, 1, 7] and tokens.detokenize([1]) == "llama text"
    assert tokens.chat_ids("hi") == [1, 7]  # the template wrote BOS and add_special added one: one is dropped
    assert tokens.prompt_format(GenRequest("k", "hi", chat=True)) == "chat"
    assert [c[1:] for c in llama.calls] == [
        ("/tokenize", {"content": "x", "add_special": True, "parse_special": False}), ("/detokenize", {"tokens": [1]}),
        ("/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/tokenize", {"content": "<s>user: hi", "add_special": True, "parse_special": True})]
    vllm = Client()
    tokens = ServerTokens(VllmServer(vllm, facts("vllm")), "none")
    assert tokens.tokenize("x", add_bos=False) == [5, 6] and tokens.detokenize([5]) == "vllm text"
    assert tokens.chat_ids("hi") == [5, 6] and tokens.prompt_format(GenRequest("k", "hi", chat=True)) == "completion"
    assert [c[1:] for c in vllm.calls] == [
        ("/tokenize", {"model": "m", "prompt": "x", "add_special_tokens": False}), ("/detokenize", {"model": "m", "tokens": [5]}),
        ("/tokenize", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True})]


def test_log_prob_requests_stay_within_what_each_server_documents() -> None:
    """vLLM: prompt_logprobs at the asked k, logprob_token_ids at the ids; llama-server: a one-token /completion
    with n_probs (pre-sampling) and no prompt log-probs; a plain server: echo and logprobs (by token text)."""
    import math

    from evalkit.engines.openai_discovery import read_limit

    # vLLM 0.32's refusal of more than --max-logprobs (vllm/sampling_params.py _validate_logprobs)
    assert read_limit("POST /v1/completions: HTTP 400: Requested prompt logprobs of 2000, which is greater than "
                      "max allowed: 20") == 20
    assert read_limit("HTTP 400: bad request") is None
    vllm = VllmServer(Client(), facts("vllm"))
    assert vllm.score_request([1, 2, 3], 20)[1]["prompt_logprobs"] == 20
    answer = {"choices": [{"prompt_logprobs": [None, {"2": {"logprob": -1.5, "rank": 3}, "9": {"logprob": -0.2, "rank": 1}},
                                               {"3": {"logprob": -0.7, "rank": 1}}]}]}
    lps, top = vllm.read_scores([1, 2, 3], answer, 1)
    assert lps == [None, -1.5, -0.7] and top == [[], [(9, -0.2)], [(3, -0.7)]]
    path, body = vllm.next_token_request([1, 2], [7, 8], 64)
    assert body["logprob_token_ids"] == [7, 8] and vllm.reads_at_ids
    got = vllm.read_next_token({"choices": [{"logprobs": {"top_logprobs": [{"token_id:7": -0.1, "token_id:8": -3.0}]}}]}, [7, 8], [])
    assert got == [-0.1, -3.0]
    llama = LlamaServer(Client(), facts("llama.cpp"))
    path, body = llama.next_token_request([1, 2], [7, 8], 64)
    assert path == "/completion" and body["n_probs"] == 64 and body["post_sampling_probs"] is False and body["n_predict"] == 1
    got = llama.read_next_token({"completion_probabilities": [{"top_logprobs": [{"id": 7, "logprob": -0.5}]}]}, [7, 8], [])
    assert got[0] == -0.5 and math.isnan(got[1])  # 8 outside the top-k: the engine asks again at the limit
    with pytest.raises(NotImplementedError, match="echo"):
        llama.score_request([1, 2], 0)
    plain = PlainOpenAI(Client(), ServerFacts("openai", "m", ["m"], None, frozenset(Capability), {}, max_logprobs=5))
    assert plain.score_request([1, 2, 3], 0)[1] == {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0,
                                                    "echo": True, "logprobs": 1}
    lps, top = plain.read_scores([1, 2, 3], {"choices": [{"logprobs": {"token_logprobs": [None, -1.0, -2.0, -0.1]}}]}, 0)
    assert lps == [None, -1.0, -2.0] and top is None and not plain.top_k_by_id
    got = plain.read_next_token({"choices": [{"logprobs": {"top_logprobs": [{" A": -0.3, " B": -1.2}]}}]}, [7, 8, 9], [" A", " B", " C"])
    assert got[:2] == [-0.3, -1.2] and math.isnan(got[2])
