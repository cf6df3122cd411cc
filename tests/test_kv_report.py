"""The report's table of the KV cache's own drift by position (issue 34, items 2 and 5): each quantized-KV
deployment against its twin with a 16-bit KV cache (suites.perplexity.kv_reference's kv_* rows), beside the
drift against the reference. Score rows written by hand; no engine."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd


def _row(dep: str, cat: str, metric: str, value: float, lo: float | None = None, hi: float | None = None, n: int = 512) -> dict[str, object]:
    return {"deployment": dep, "suite": "perplexity", "category": cat, "metric": metric, "value": value,
            "ci_low": lo, "ci_high": hi, "n": n}


def test_kv_table_shows_each_quantized_kv_deployment_against_its_twin(tmp_path: Path) -> None:
    from evalkit.report.view import RunView
    from evalkit.results import Run
    from evalkit.suites.report.perplexity import section

    rows = [
        # against the reference (all three deployments)
        *[_row(d, "pos 0-512", m, v) for d in ("kvf16", "kvq8", "kvq4") for m, v in (("pos_kld", 0.004), ("pos_top1_agreement", 0.94))],
        *[_row(d, "pos 0-512", "top1_below_from", 0.0) for d in ("kvf16", "kvq8", "kvq4")],
        # against the f16-KV twin: q8_0 never falls below 95%, q4_0 does from 512 on
        _row("kvq8", "pos 0-512", "kv_pos_kld", 0.0031), _row("kvq8", "pos 0-512", "kv_pos_top1_agreement", 0.967),
        _row("kvq8", "pos 512-1K", "kv_pos_kld", 0.0027), _row("kvq8", "pos 512-1K", "kv_pos_top1_agreement", 0.980, 0.97, 0.99),
        _row("kvq8", "text", "kv_top1_below_from", math.nan, n=1024),
        _row("kvq4", "pos 0-512", "kv_pos_kld", 0.033), _row("kvq4", "pos 0-512", "kv_pos_top1_agreement", 0.951),
        _row("kvq4", "pos 512-1K", "kv_pos_kld", 0.051), _row("kvq4", "pos 512-1K", "kv_pos_top1_agreement", 0.889, 0.861, 0.917),
        _row("kvq4", "pos 512-1K", "kv_top1_below_from", 512.0),
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "run_id": "r", "reference": "ref", "deployment_order": ["ref", "kvf16", "kvq8", "kvq4"],
        "suites": {"perplexity": {"top1_threshold": 0.95}}}), encoding="utf-8")
    pd.DataFrame(rows).to_csv(run / "scores.csv", index=False)
    sec = section(RunView(Run(run)))
    keys = [t.key for t in sec.tables]
    assert keys.index("perplexity-positions") < keys.index("perplexity-kv-positions")
    kv = next(t for t in sec.tables if t.key == "perplexity-kv-positions")
    assert kv.header == ["deployment", "0-512 tokens", "512-1K tokens", "first bucket below 95% top-1"]
    got = {r[0].value: r for r in kv.rows}
    assert list(got) == ["kvq8", "kvq4"]  # the f16-KV deployment has no twin rows
    assert got["kvq8"][-1].value == "none"
    assert (got["kvq4"][-1].value, got["kvq4"][-1].delta_ci) == ("512-1K", "top-1 88.9% [86.1, 91.7]")
    assert got["kvq4"][2].value == "0.051 / 88.9%"
    # the reference table is unchanged: all three deployments, against the reference
    ref = next(t for t in sec.tables if t.key == "perplexity-positions")
    assert [r[0].value for r in ref.rows] == ["kvf16", "kvq8", "kvq4"]
