"""Every metric a suite emits is declared once (evalkit.metrics.declarations); nothing is guessed from a name."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from evalkit.metrics.declarations import all_metrics, metric_spec, require_spec
from fixtures_run import build_run


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("decl"))


def test_every_emitted_metric_is_declared(scored_run: Path) -> None:
    frames = [pd.read_csv(scored_run / name, encoding="utf-8-sig") for name in ("scores.csv", "comparisons.csv")]
    emitted = {(s, m) for f in frames for s, m in zip(f["suite"], f["metric"])}
    assert len({s for s, _ in emitted}) >= 6  # every suite of the fixture run
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
