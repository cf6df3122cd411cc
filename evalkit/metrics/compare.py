"""Comparison rows (deployment minus reference) built from evalkit.metrics.stats, for every suite.

Suites collect the paired per-item values; these builders turn them into `ComparisonRow`s with one
method text and one significance rule, so a pass/fail metric reads the same in MMLU, HumanEval, the
prompt suite and long-context recall. The pass/fail score row (share correct with its Wilson interval)
is built here too, beside its comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evalkit.metrics.stats import StatsSettings, compare_pass_fail, paired_mean_diff, wilson_ci
from evalkit.store import ComparisonRow, ScoreRow


def pass_fail_scores(deployment: str, suite: str, category: str, metric: str, ok: Sequence[bool],
                     settings: StatsSettings) -> list[ScoreRow]:
    """The share of items correct with its Wilson interval; no row for no items (as `pass_fail_rows`)."""
    n = len(ok)
    if n == 0:
        return []
    k = sum(ok)
    lo, hi = wilson_ci(k, n, settings.alpha)
    return [ScoreRow(deployment, suite, category, metric, k / n, lo, hi, n)]


@dataclass(frozen=True)
class Compared:
    """Which rows a comparison makes: a deployment against the reference, in one suite's category and metric."""

    deployment: str
    reference: str
    suite: str
    category: str
    metric: str


def pass_fail_rows(of: Compared, deployment_ok: Sequence[bool], reference_ok: Sequence[bool], settings: StatsSettings,
                   flips: bool = False, unit: str = "items") -> list[ComparisonRow]:
    """The share-correct difference of `of.metric`; with `flips`, also flip_rate and both flip directions (Wilson CIs).

    Flip rows: the reference has none, so value == diff; their `significant` is the paired difference's
    (a flip count on its own is not a difference from the reference, the asymmetry of flips is).
    """
    res = compare_pass_fail(deployment_ok, reference_ok, settings)
    if res.n == 0:
        return []
    deployment, reference, suite, category, metric = of.deployment, of.reference, of.suite, of.category, of.metric
    rows = [ComparisonRow(deployment, reference, suite, category, metric, res.value, res.reference_value, res.diff,
                          res.ci_low, res.ci_high, res.p_value, res.n, res.method, res.significant)]
    if flips:
        level = f"{100 * (1 - settings.alpha):g}%"
        for name, k, lo, hi in res.flip_shares():
            rows.append(ComparisonRow(deployment, reference, suite, category, name, k / res.n, 0.0, k / res.n, lo, hi,
                                      res.p_value, res.n,
                                      f"share of {unit}; CI: Wilson {level}; p: McNemar exact (flip asymmetry)",
                                      res.significant))
    return rows


def continuous_row(deployment: str, reference: str, suite: str, category: str, metric: str,
                   deployment_values: Sequence[float], reference_values: Sequence[float],
                   settings: StatsSettings) -> ComparisonRow:
    """Paired bootstrap of the mean per-item difference (no p-value: the interval decides)."""
    res = paired_mean_diff(deployment_values, reference_values, settings)
    return ComparisonRow(deployment, reference, suite, category, metric, float(np.mean(deployment_values)),
                         float(np.mean(reference_values)), res.diff, res.ci_low, res.ci_high, None, res.n, res.method,
                         res.excludes_zero)
