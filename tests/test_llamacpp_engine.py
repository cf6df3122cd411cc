"""The llama.cpp engine against the real Gemma 3 270M Q4_K_M and SmolLM2 GGUFs."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from evalkit.engines.base import GenRequest, SamplingParams

from conftest import REPO, threads_at_most

pytestmark = pytest.mark.engine


def test_generation_is_deterministic_at_temperature_zero(gemma_engine) -> None:  # type: ignore[no-untyped-def]
    reqs = [GenRequest("a", "The capital of France is", chat=False), GenRequest("b", "def add(a, b):", chat=False)]
    first = list(gemma_engine.generate(reqs, SamplingParams(max_tokens=12)))
    second = list(gemma_engine.generate(reqs[::-1], SamplingParams(max_tokens=12)))
    by_key = {r.key: r for r in second}
    for r in first:
        assert r.output_text and len(r.output_token_ids) <= 12
        assert r.output_token_ids == by_key[r.key].output_token_ids
        assert r.prompt_token_ids[0] == 2  # Gemma's GGUF says add_bos_token: BOS first
        assert r.prompt_format == "completion"  # base model: no chat template in the GGUF
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.total_s


def test_max_tokens_and_sampling_seed(gemma_engine) -> None:  # type: ignore[no-untyped-def]
    req = [GenRequest("s", "Once upon a time", chat=False, max_tokens=5)]
    hot = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=50, seed=7)
    a = list(gemma_engine.generate(req, hot))[0]
    b = list(gemma_engine.generate(req, hot))[0]
    assert len(a.output_token_ids) == 5
    assert a.output_token_ids == b.output_token_ids  # same seed, same sample


SEEDED = GenRequest("seeded", "Once upon a time", chat=False, max_tokens=32)
HOT = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=32, seed=7)


def test_seeded_sample_does_not_depend_on_what_ran_before(gemma_gguf: Path) -> None:
    """One seeded request after different histories on one engine gives the tokens a fresh engine gives.

    Before the fix, llama-cpp-python reused the cached prefix of the previous request: the prompt was then
    evaluated in another batch shape, the logits moved in the last bits, and the sample diverged."""
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    def fresh() -> LlamaCppEngine:
        return LlamaCppEngine(str(gemma_gguf), LlamaCppOptions(n_ctx=512))

    first = fresh()
    expected = list(first.generate([SEEDED], HOT))[0].output_token_ids
    first.close()
    assert len(expected) == 32
    engine = fresh()
    histories = {
        "an unrelated prompt": lambda: list(engine.generate([GenRequest("o", "Water boils at", chat=False)], HOT)),
        "itself (a full prefix-cache hit)": lambda: list(engine.generate([SEEDED], HOT)),
        "a longer prompt sharing its prefix": lambda: list(
            engine.generate([GenRequest("l", "Once upon a time, in a land far away, there", chat=False)], SamplingParams(max_tokens=20))
        ),
        "a batch around it": lambda: None,
        "scoring": lambda: engine.score([engine.tokenize("Some unrelated text to score here.", True)]),
        "another seed": lambda: list(engine.generate([SEEDED], SamplingParams(**{**HOT.__dict__, "seed": 8}))),
    }
    try:
        for history, run in histories.items():
            run()
            if history == "a batch around it":
                batch = [GenRequest("b1", "The capital of France is", chat=False), SEEDED, GenRequest("b2", "def f(x):", chat=False)]
                got = {r.key: r.output_token_ids for r in engine.generate(batch, HOT)}["seeded"]
            else:
                got = list(engine.generate([SEEDED], HOT))[0].output_token_ids
            assert got == expected, f"after {history}"
        # The seed matters (else the assertions above could not fail): another seed, another sample.
        other = list(engine.generate([SEEDED], SamplingParams(**{**HOT.__dict__, "seed": 8})))[0].output_token_ids
        assert other != expected
    finally:
        engine.close()


def test_prefix_reuse_changes_no_logit_and_no_sample(smollm_gguf: Path) -> None:
    """Prompts sharing a long prefix reuse its KV cache (long-context prompts share their filler, few-shot
    prompts their examples), and every logit and seeded sample equals a fresh engine's: also when the shared
    part runs into tokens the engine generated itself (one-row batches: they are not reused)."""
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    def fresh() -> LlamaCppEngine:
        return LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=2048))

    text = (REPO / "texts" / "ppl_default.txt").read_text(encoding="utf-8")
    engine = fresh()
    filler = engine.tokenize(text, add_bos=True)[:1000]
    question = engine.tokenize(" The pass key is 12345. What is the pass key? The pass key is", add_bos=False)
    # 760 tokens: the 24 generated after it cross the multiples of 16 at 768 and 784, so a reuse that wrongly took
    # generated rows would start there instead of at 752.
    long_prompt = filler[: 760 - len(question)] + question
    req = GenRequest("p", "", chat=False, max_tokens=24, prompt_token_ids=tuple(long_prompt))
    vocab = list(range(engine.info().vocab_size))
    try:
        list(engine.generate([GenRequest("f", "", chat=False, max_tokens=8, prompt_token_ids=tuple(filler))], HOT))
        (got,) = engine.generate([req], HOT)
        reused = engine.run_stats()["reused_prompt_tokens"]
        # What the engine generated is now in its cache, evaluated one token at a time; a prompt continuing it:
        follow_up = long_prompt + list(got.output_token_ids) + filler[800:900]
        follow_logits = engine.next_token_logprobs([follow_up], vocab)[0]
        got_logits = engine.next_token_logprobs([long_prompt], vocab)[0]
    finally:
        engine.close()
    assert reused >= 640, f"only {reused} prompt tokens came from the cache"  # 760 - len(question) shared
    clean = fresh()
    try:
        (want,) = clean.generate([req], HOT)
        assert clean.run_stats()["reused_prompt_tokens"] == 0
    finally:
        clean.close()
    want_logits, want_follow = (fresh_logits(fresh, p, vocab) for p in (long_prompt, follow_up))
    assert len(want.output_token_ids) == 24 and got.output_token_ids == want.output_token_ids
    assert got_logits == want_logits  # bit for bit
    assert follow_logits == want_follow


def test_reuse_points_are_exact_on_repacked_k_quants(gemma_gguf: Path) -> None:
    """Gemma 3's Q4_K_M runs through ggml's repacked kernels, which take a batch's rows four at a time: reusing a
    cached prefix at a point that is not a multiple of 4 moves the prompt's last row into another group and its
    logits (measured: every such point differs, AVX-512 and AVX2 builds). The engine reuses at multiples of 16
    only; each shared length here gives the logits of an engine that never saw the first prompt, bit for bit.
    The same prompts reused at multiples of 2 differ, so the comparison can fail."""
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    def fresh() -> LlamaCppEngine:
        return LlamaCppEngine(str(gemma_gguf), LlamaCppOptions(n_ctx=512))

    text = (REPO / "texts" / "ppl_default.txt").read_text(encoding="utf-8")
    engine = fresh()
    tokens = engine.tokenize(text, add_bos=True)
    prompt, other = tokens[:150], tokens[160:180]
    vocab = list(range(engine.info().vocab_size))
    shared = [20, 37, 66, 100, 133, 134]  # reuse points 16, 32, 64, 96, 128, 128 (at least 16 rows evaluated)
    try:
        want = fresh_logits(fresh, prompt, vocab)
        got, reused = [], []
        for n in shared:
            engine.next_token_logprobs([prompt[:n] + other], vocab)  # the cached context shares n tokens
            before = engine.run_stats()["reused_prompt_tokens"]
            got.append(engine.next_token_logprobs([prompt], vocab)[0])
            reused.append(engine.run_stats()["reused_prompt_tokens"] - before)
        assert reused == [16, 32, 64, 96, 128, 128]
        for n, logits in zip(shared, got):
            assert logits == want, f"sharing {n} tokens"
        engine._reuse_align = 2  # what the rule guards against: reuse points 2 apart
        moved = []
        for n in (38, 102):  # reuse at 38 and 102: not multiples of 4
            engine.next_token_logprobs([prompt[:n] + other], vocab)
            moved.append(engine.next_token_logprobs([prompt], vocab)[0] != want)
        assert any(moved), "reusing at points that are not multiples of 4 gave a fresh pass's logits too"
    finally:
        engine.close()


def test_flash_attention_reuses_no_prefix(smollm_gguf: Path) -> None:
    """With flash attention a row's logits change with the cache's extent (measured: SmolLM2 Q4_1 reused at most
    multiples of 2 up to 150 differs in every row after the reuse point), so an engine with it on evaluates every
    prompt whole, and its logits are a fresh engine's (llama-server's defaults are compared with it:
    test_served)."""
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    def fresh() -> LlamaCppEngine:
        return LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512, flash_attn=True))

    engine = fresh()
    tokens = engine.tokenize((REPO / "texts" / "ppl_default.txt").read_text(encoding="utf-8"), add_bos=True)
    prompt, other = tokens[:150], tokens[160:180]
    vocab = list(range(engine.info().vocab_size))
    try:
        assert engine.info().extra["flash_attn"] is True
        engine.next_token_logprobs([prompt[:130] + other], vocab)
        got = engine.next_token_logprobs([prompt], vocab)[0]
        assert engine.run_stats()["reused_prompt_tokens"] == 0
    finally:
        engine.close()
    assert got == fresh_logits(fresh, prompt, vocab)


def fresh_logits(make, prompt: list[int], vocab: list[int]) -> list[float]:  # type: ignore[no-untyped-def]
    engine = make()
    try:
        return engine.next_token_logprobs([prompt], vocab)[0]
    finally:
        engine.close()


def test_ignore_eos_gives_exactly_max_tokens(smollm_gguf: Path) -> None:
    """SmolLM2-Instruct answers "Say OK." in a few tokens and stops; with ignore_eos it must go on to max_tokens."""
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512))
    try:
        req = GenRequest("ok", "Reply with the single word OK.", max_tokens=40)
        (stopped,) = engine.generate([req], SamplingParams(max_tokens=40))
        assert stopped.finish_reason == "stop" and len(stopped.output_token_ids) < 40  # the case ignore_eos is for
        (forced,) = engine.generate([GenRequest("ok", req.prompt, max_tokens=40, ignore_eos=True)], SamplingParams(max_tokens=40))
        assert len(forced.output_token_ids) == 40 and forced.finish_reason == "length"
        assert forced.output_token_ids[: len(stopped.output_token_ids)] == stopped.output_token_ids
    finally:
        engine.close()


def test_tight_decode_gives_llama_cpp_pythons_tokens(smollm_gguf: Path) -> None:
    """The engine's own decode loop (llama_decode + llama.cpp's C sampler chain) gives exactly the tokens and text
    of llama-cpp-python's Llama.generate (evalkit's loop before it), greedy and seeded, on the real SmolLM2 GGUF:
    requests served in turn through one context, the reference a separate Llama evaluating each prompt afresh."""
    import llama_cpp

    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    engine = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512, n_threads=threads_at_most(2)))
    ref = llama_cpp.Llama(model_path=str(smollm_gguf), n_ctx=512, n_threads=threads_at_most(2), n_threads_batch=threads_at_most(2), n_batch=512, n_ubatch=512, verbose=False)
    try:
        reqs = [GenRequest("code", "Write a Python function that reverses a string."),
                GenRequest("story", "Once upon a time", chat=False), GenRequest("capital", "What is the capital of Canada?")]
        for sampling in (SamplingParams(0.0, 1.0, 32, 0), SamplingParams(0.8, 0.9, 32, 3), SamplingParams(1.0, 1.0, 32, 7)):
            for got in engine.generate(reqs, sampling):
                ref.reset()
                ref.set_seed(sampling.seed)
                want: list[int] = []
                for tok in ref.generate(got.prompt_token_ids, temp=sampling.temperature, top_p=sampling.top_p, top_k=0, min_p=0.0, repeat_penalty=1.0):
                    if llama_cpp.llama_vocab_is_eog(ref._model.vocab, tok) or len(want) == sampling.max_tokens:
                        break
                    want.append(tok)
                assert got.output_token_ids == want, (sampling, got.key)
                assert got.output_text == ref.detokenize(want).decode("utf-8", errors="replace")
        hot = [r.output_token_ids for r in engine.generate(reqs[1:2], SamplingParams(1.0, 1.0, 32, 7))]
        assert hot != [r.output_token_ids for r in engine.generate(reqs[1:2], SamplingParams(1.0, 1.0, 32, 8))]  # seeds matter
    finally:
        ref.close()
        engine.close()


def test_logprobs_match_a_direct_computation(gemma_engine) -> None:  # type: ignore[no-untyped-def]
    ids = gemma_engine.tokenize("The quick brown fox jumps over the lazy dog.", add_bos=True)
    scores = gemma_engine.score([ids], top_k=5)[0]
    assert scores.logprobs[0] is None
    assert all(lp is not None and lp <= 0 and math.isfinite(lp) for lp in scores.logprobs[1:])
    # Direct: full-vocabulary distributions from one teacher-forced pass, read by hand.
    rows = np.concatenate([r for _, r in gemma_engine.full_logprobs(ids)])
    for pos in range(1, len(ids)):
        assert scores.logprobs[pos] == pytest.approx(float(rows[pos - 1, ids[pos]]), abs=1e-5)
        assert np.exp(rows[pos - 1]).sum() == pytest.approx(1.0, abs=1e-3)
        top_ids = [t for t, _ in scores.top[pos]]
        assert top_ids[0] == int(rows[pos - 1].argmax())
    # The next-token view agrees with the sequence view at the same prefix.
    nxt = gemma_engine.next_token_logprobs([ids[:5]], [ids[5]])[0][0]
    assert nxt == pytest.approx(scores.logprobs[5], abs=1e-4)


def test_generation_after_scoring_is_unchanged(gemma_engine) -> None:  # type: ignore[no-untyped-def]
    req = [GenRequest("x", "Water boils at", chat=False, max_tokens=8)]
    before = list(gemma_engine.generate(req, SamplingParams()))[0].output_token_ids
    gemma_engine.score([gemma_engine.tokenize("Some unrelated text to score.", True)])
    after = list(gemma_engine.generate(req, SamplingParams()))[0].output_token_ids
    assert before == after


def test_chat_template_from_gguf(smollm_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512))
    try:
        info = engine.info()
        assert info.chat_template is not None and info.add_bos is False
        chat = engine.prompt_token_ids(GenRequest("c", "Hi!", chat=True))
        plain = engine.prompt_token_ids(GenRequest("c", "Hi!", chat=False))
        assert "user\nHi!\nassistant" in engine.detokenize(chat) and len(chat) > len(plain) + 4
        res = list(engine.generate([GenRequest("c", "What is 2+2?")], SamplingParams(max_tokens=16)))[0]
        assert res.prompt_format == "chat" and res.output_text
        no_template = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=512, chat_template="none"))
        assert no_template.prompt_token_ids(GenRequest("c", "Hi!", chat=True)) == plain
        no_template.close()
    finally:
        engine.close()


def test_options_pass_through(gemma_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(str(gemma_gguf), LlamaCppOptions(n_ctx=256, n_threads=1, n_batch=64))
    try:
        assert engine._llm.n_ctx() == 256 and engine._llm.n_batch == 64 and engine.info().extra["n_threads"] == 1
        long_ids = engine.tokenize("word " * 200, True)  # 201 tokens, 4 batches of 64 when scoring
        s = engine.score([long_ids])[0]
        assert len(s.logprobs) == len(long_ids) and s.logprobs[-1] is not None
    finally:
        engine.close()


def test_corrupt_gguf_is_a_model_file_error(tmp_path: Path, gemma_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine
    from evalkit.errors import ModelFileError

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gemma_gguf.read_bytes()[:4096])  # right magic, truncated body
    with pytest.raises(ModelFileError, match="broken.gguf"):
        LlamaCppEngine(str(broken), LlamaCppOptions(n_ctx=256))


def test_threads_follow_the_free_cores_and_change_no_logit(smollm_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment that started while other work held a core (one thread of two) takes the core back at its
    next call once the other work is done, and the logits and greedy tokens are the same bits with 1 and 2
    threads (why n_threads is not in the numerics key). The free-core reading is stubbed: the machine's real
    load is not the test's to set."""
    from evalkit.engines import llamacpp as mod

    readings: list[int] = []  # what each free-core reading said: 1 at loading, 2 from then on

    def free_cores(sample_s: float = 0.5) -> int:
        readings.append(2 if readings else 1)
        return readings[-1]

    monkeypatch.setattr(mod, "engine_threads", free_cores)
    monkeypatch.setattr(mod.LlamaCppEngine, "_THREADS_RECHECK_S", 1e9)
    engine = mod.LlamaCppEngine(str(smollm_gguf), mod.LlamaCppOptions(n_ctx=512))
    text = (REPO / "texts" / "ppl_default.txt").read_text(encoding="utf-8")
    prompt = engine.tokenize(text, add_bos=True)[:300]
    other = engine.tokenize("A different opening, so nothing of the prompt stays in the cache.", add_bos=True)
    vocab = list(range(engine.info().vocab_size))
    req = GenRequest("t", "", chat=False, max_tokens=16, prompt_token_ids=tuple(prompt))
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=16, seed=0)
    try:
        one_logits = engine.next_token_logprobs([prompt], vocab)[0]
        (one,) = engine.generate([req], greedy)
        assert engine.info().extra["n_threads"] == 1
        monkeypatch.setattr(mod.LlamaCppEngine, "_THREADS_RECHECK_S", 0.0)
        engine.next_token_logprobs([other], vocab)  # the free cores read again here: 2
        two_logits = engine.next_token_logprobs([prompt], vocab)[0]  # evaluated afresh with 2 threads
        (two,) = engine.generate([req], greedy)
        info = engine.info().extra
    finally:
        engine.close()
    assert readings[:2] == [1, 2] and info["n_threads"] == 2 and info["n_threads_batch"] == 2 and info["n_threads_used"] == [1, 2]
    assert two_logits == one_logits  # bit for bit
    assert len(one.output_token_ids) == 16 and two.output_token_ids == one.output_token_ids


def test_an_engine_loaded_for_later_reads_the_free_cores_at_its_first_call(smollm_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded early beside other work (executors.warm), an engine is sized for running alone, a guess about its
    turn: its first call reads the free cores at once, not 15 s later (two threads on a machine whose other core
    stayed busy spin against that work: test_pipeline's one-thread run took 64-77 s instead of 30). Loaded at its
    turn, the load's reading stands until the re-check interval. The free-core reading is stubbed."""
    from evalkit.engines import llamacpp as mod
    from evalkit.hardware import LOADING_FOR_LATER

    readings: list[int] = []

    def free_cores(sample_s: float = 0.5) -> int:
        readings.append(2 if not readings else 1)  # 2 at loading (sized to run alone), 1 at the turn
        return readings[-1]

    monkeypatch.setattr(mod, "engine_threads", free_cores)
    prompt = list(range(1, 40))
    for early in (True, False):
        readings.clear()
        if early:
            monkeypatch.setenv(LOADING_FOR_LATER, "1")
        engine = mod.LlamaCppEngine(str(smollm_gguf), mod.LlamaCppOptions(n_ctx=256))
        monkeypatch.delenv(LOADING_FOR_LATER, raising=False)  # the turn comes (executors.warm.load_then_wait)
        try:
            engine.next_token_logprobs([prompt], [0])
            info = engine.info().extra
        finally:
            engine.close()
        if early:
            assert readings == [2, 1] and info["n_threads"] == 1 and info["n_threads_used"] == [1, 2]
        else:
            assert readings == [2] and info["n_threads"] == 2 and info["n_threads_used"] == [2]
