"""Every metric a suite emits is declared once (evalkit.metrics.declarations); nothing is guessed from a name."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from evalkit.metrics.declarations import all_metrics, metric_spec, require_spec


@pytest.fixture(scope="module")
def scored_run(rated_run: tuple[Path, list]) -> Path:
    """The session's real run with ratings imported (conftest.rated_run): every suite's metrics, as scored."""
    return rated_run[0]


@pytest.mark.engine
def test_every_emitted_metric_is_declared(scored_run: Path) -> None:
    frames = [pd.read_csv(scored_run / name, encoding="utf-8-sig") for name in ("scores.csv", "comparisons.csv")]
    emitted = {(s, m) for f in frames for s, m in zip(f["suite"], f["metric"])}
    assert {s for s, _ in emitted} >= {"prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost", "ratings"}
    assert ("ratings", "krippendorff_alpha") in emitted  # imported ratings are scored like any suite
    undeclared = sorted(f"{s}/{m}" for s, m in emitted if metric_spec(s, m) is None)
    assert not undeclared, f"undeclared metrics: {undeclared}"


def test_lookup_exact_family_and_unknown() -> None:
    assert metric_spec("mmlu", "accuracy").direction == "higher"
    assert metric_spec("mmlu", "accuracy").paired_test == "mcnemar"
    assert metric_spec("prompts", "bleu_en-zh").paired_test == "corpus_bootstrap"
    assert metric_spec("prompts", "chrf_en-de").fmt == "score"
    assert metric_spec("prompts", "bleu_en-") is None  # a family needs a member suffix
    assert metric_spec("cost", "latency_p90_s").direction == "lower"
    assert metric_spec("mmlu", "pass@1") is None  # declarations are per suite
    with pytest.raises(KeyError, match="mmlu/no_such_metric"):
        require_spec("mmlu", "no_such_metric")


def test_declarations_are_consistent() -> None:
    seen = set()
    for s in all_metrics():
        assert (s.suite, s.name) not in seen
        seen.add((s.suite, s.name))
        assert s.direction in ("higher", "lower", "none") and s.kind in ("rate", "continuous", "count")
        if s.kind == "count":
            assert s.direction == "none" and s.paired_test == "none"
        if s.paired_test == "mcnemar":
            assert s.kind == "rate"  # McNemar needs pass/fail items


@pytest.mark.engine
def test_report_marks_follow_the_declared_direction(scored_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip a metric's declared direction and the report's better/worse mark flips: it reads the declaration."""
    import dataclasses

    from evalkit.metrics import declarations
    from evalkit.report.view import RunView
    from evalkit.results import Run

    view = RunView(Run(scored_run))
    comps = view.comps
    sig = comps[comps.significant.astype(bool) & (comps["diff"] != 0)]
    sig = sig[[declarations.metric_spec(s, m) is not None and declarations.metric_spec(s, m).direction != "none"
               and (s, m) in declarations._EXACT for s, m in zip(sig.suite, sig.metric)]]
    assert not sig.empty
    row = sig.iloc[0]
    spec = declarations.metric_spec(row.suite, row.metric)
    expected = "better" if row["diff"] * spec.better > 0 else "worse"
    assert view.cell(row.deployment, row.suite, str(row.category), row.metric).mark == expected
    flipped = dataclasses.replace(spec, direction="lower" if spec.direction == "higher" else "higher")
    monkeypatch.setitem(declarations._EXACT, (row.suite, row.metric), flipped)
    assert view.cell(row.deployment, row.suite, str(row.category), row.metric).mark == {"better": "worse", "worse": "better"}[expected]
    monkeypatch.delitem(declarations._EXACT, (row.suite, row.metric))  # undeclared: no direction, no guess
    assert view.cell(row.deployment, row.suite, str(row.category), row.metric).mark == "changed"
