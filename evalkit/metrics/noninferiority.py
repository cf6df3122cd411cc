"""Non-inferiority: is a deployment's loss against the reference smaller than the largest acceptable one?

"Not significantly different" is not "good enough": with few items every interval is wide and nothing is
significant. A non-inferiority test asks the question a decision needs. Given a margin M (the worst
acceptable value of the tested quantity) and the paired interval [lo, hi] already in comparisons.csv /
scores.csv, the bound of the interval that faces the margin decides:

    direction "higher" (e.g. accuracy difference, margin -0.02):  lo > M -> non-inferior
                                                                  hi < M -> inferior
    direction "lower"  (e.g. perplexity ratio, margin 1.05):      hi < M -> non-inferior
                                                                  lo > M -> inferior
    otherwise (the interval contains M, or there is no interval): inconclusive

The interval is the run's two-sided (1 - alpha) interval, so each one-sided test runs at level alpha/2
(2.5% for alpha = 0.05): the convention of non-inferiority trials (CONSORT), and the same interval the
report prints, so what is shown and what is decided never disagree.

The tested quantity is the paired difference (deployment - reference) for metrics both sides have
(accuracy, chrF, ...), and the deployment's own value for metrics that only exist against a reference
(perplexity ratio, KL-divergence, top-1 agreement): see `tested_quantity`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from evalkit.metrics.stats import Z_95, Z_POWER_80

Direction = Literal["higher", "lower"]
Verdict = Literal["non-inferior", "inferior", "inconclusive"]
Basis = Literal["difference", "value"]
VERDICTS: tuple[Verdict, ...] = ("non-inferior", "inferior", "inconclusive")


@dataclass(frozen=True)
class NonInferiority:
    """One margin's outcome for one deployment."""

    estimate: float  # the tested quantity (difference or value)
    ci_low: float | None
    ci_high: float | None
    margin: float
    direction: Direction
    decision: Verdict
    n: int  # items (tokens for perplexity) behind the interval
    n_needed: int | None  # inconclusive only: items that would show non-inferiority with 80% power
    basis: Basis = "difference"

    @property
    def bound(self) -> float | None:
        """The one-sided bound that is compared with the margin (the worse end of the interval)."""
        return self.ci_low if self.direction == "higher" else self.ci_high

    def looser_margin(self) -> float | None:
        """Inferior or inconclusive: the margin the observed interval would just clear (its worse bound)."""
        return self.bound


def non_inferiority(estimate: float, ci_low: float | None, ci_high: float | None, n: int, margin: float,
                    direction: Direction, basis: Basis = "difference") -> NonInferiority:
    """Classify one paired interval against a margin (see the module doc for the rule)."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"a margin needs a better direction (got {direction!r})")
    ok = [x is not None and math.isfinite(x) for x in (estimate, ci_low, ci_high)]
    if not all(ok):
        return NonInferiority(estimate, ci_low, ci_high, margin, direction, "inconclusive", n, None, basis)
    lo, hi = float(ci_low), float(ci_high)  # type: ignore[arg-type]
    good, bad = (lo, hi) if direction == "higher" else (hi, lo)  # bound facing the margin, the other one
    sign = 1.0 if direction == "higher" else -1.0  # + : larger is better
    if sign * (good - margin) > 0:
        verdict: Verdict = "non-inferior"
    elif sign * (bad - margin) < 0:
        verdict = "inferior"
    else:
        verdict = "inconclusive"
    needed = items_needed(estimate, lo, hi, n, margin, direction) if verdict == "inconclusive" else None
    return NonInferiority(estimate, lo, hi, margin, direction, verdict, n, needed, basis)


def items_needed(estimate: float, ci_low: float, ci_high: float, n: int, margin: float,
                 direction: Direction = "higher", z_alpha: float = Z_95, power_z: float = Z_POWER_80) -> int | None:
    """Items that would show non-inferiority with 80% power if the observed estimate were the truth, for an
    interval whose half-width shrinks as 1 / sqrt(n) (normal and t intervals): None when the estimate is not
    on the good side of the margin (more items would then show inferiority, not non-inferiority).

    The interval's half-width on the side facing the margin, h, is z_alpha * s / sqrt(n); the test reaches
    `power` (z for 0.8 by default) once (z_alpha + power_z) * s / sqrt(n') < |estimate - M|:

        n' = ceil( n * ((z_alpha + power_z) / z_alpha * h / |estimate - M|)^2 )

    Pass/fail metrics do not come here: their sample size is the score test's own
    (evalkit.metrics.stats.pass_fail_items_needed).
    """
    gap = abs(estimate - margin)
    if n <= 0 or gap == 0:
        return None
    if (estimate < margin) if direction == "higher" else (estimate > margin):
        return None
    h = (estimate - ci_low) if direction == "higher" else (ci_high - estimate)
    ratio = n * ((z_alpha + power_z) / z_alpha * h / gap) ** 2
    return max(n + 1, math.ceil(round(ratio, 6)))  # round: 0.04/0.01 squared is 16.000000000000004
