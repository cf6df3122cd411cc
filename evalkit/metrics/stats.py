"""Shared statistics for paired comparisons: binomial intervals, paired bootstrap, McNemar and flips.

Every function here is a thin, documented wrapper over scipy.stats / statsmodels so suites agree on
conventions (95% by default, deployment minus reference, NaN/None for "cannot say" rather than a guess).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar

CONFIDENCE = 0.95


def wilson_ci(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (nan, nan) when n == 0.

    Wilson rather than Wald: it stays inside [0, 1] and behaves at k = 0 or k = n, which small
    per-subject samples (20 questions) hit often.
    """
    if n <= 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


@dataclass(frozen=True)
class PairedDiff:
    """mean(a) - mean(b) over paired observations, with a bootstrap CI (None when it cannot be formed)."""

    diff: float
    ci_low: float | None
    ci_high: float | None
    n: int
    method: str

    @property
    def excludes_zero(self) -> bool:
        """True when the CI lies entirely on one side of 0 (a difference beyond the resampling noise)."""
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 0 or self.ci_high < 0)


def paired_bootstrap_diff(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = CONFIDENCE,
    n_resamples: int = 9999,
    seed: int = 0,
    method: str = "BCa",
) -> PairedDiff:
    """Paired bootstrap CI of mean(a) - mean(b) (a = deployment, b = reference, same items, same order).

    Uses scipy.stats.bootstrap(paired=True): items are resampled together, so item difficulty cancels.
    Degenerate cases are answered directly instead of letting BCa return NaN with a warning:
    n < 2 -> no CI; all paired differences equal -> the CI is that single value.
    """
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and the same length (got {x.shape} and {y.shape})")
    n = int(x.size)
    if n == 0:
        return PairedDiff(math.nan, None, None, 0, "none (no items)")
    diff = float(x.mean() - y.mean())
    if n < 2:
        return PairedDiff(diff, None, None, n, "difference only (n < 2)")
    d = x - y
    if np.all(d == d[0]):
        return PairedDiff(diff, diff, diff, n, "exact (all paired differences equal)")

    def mean_diff(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        return u.mean(axis=axis) - v.mean(axis=axis)

    res = stats.bootstrap(
        (x, y),
        mean_diff,
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        random_state=np.random.default_rng(seed),
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa can fail on very lumpy data
        return paired_bootstrap_diff(a, b, confidence, n_resamples, seed, method="percentile")
    return PairedDiff(diff, low, high, n, f"paired bootstrap ({method}, {n_resamples} resamples)")


@dataclass(frozen=True)
class Flips:
    """How per-item correctness changed between a reference and a deployment on the same items.

    right_to_wrong: reference correct, deployment wrong; wrong_to_right: the reverse.
    p_value: exact McNemar test (binomial on the discordant pairs) that both directions are equally likely.
    """

    n: int
    both_right: int
    both_wrong: int
    right_to_wrong: int
    wrong_to_right: int
    p_value: float

    @property
    def flipped(self) -> int:
        return self.right_to_wrong + self.wrong_to_right

    @property
    def flip_rate(self) -> float:
        return self.flipped / self.n if self.n else math.nan

    @property
    def right_to_wrong_rate(self) -> float:
        return self.right_to_wrong / self.n if self.n else math.nan

    @property
    def wrong_to_right_rate(self) -> float:
        return self.wrong_to_right / self.n if self.n else math.nan


def mcnemar_flips(reference_correct: Sequence[bool], deployment_correct: Sequence[bool]) -> Flips:
    """Flip counts and McNemar's exact p-value for paired binary outcomes (same items, same order)."""
    ref = np.asarray(reference_correct, dtype=bool)
    dep = np.asarray(deployment_correct, dtype=bool)
    if ref.shape != dep.shape or ref.ndim != 1:
        raise ValueError(f"paired outcomes must be 1-D and the same length (got {ref.shape} and {dep.shape})")
    both_right = int(np.sum(ref & dep))
    r2w = int(np.sum(ref & ~dep))
    w2r = int(np.sum(~ref & dep))
    both_wrong = int(np.sum(~ref & ~dep))
    # Rows: reference right/wrong; columns: deployment right/wrong. Only the off-diagonal matters.
    table = [[both_right, r2w], [w2r, both_wrong]]
    p = float(mcnemar(table, exact=True).pvalue)  # no discordant pairs -> 1.0
    return Flips(n=int(ref.size), both_right=both_right, both_wrong=both_wrong,
                 right_to_wrong=r2w, wrong_to_right=w2r, p_value=p)
