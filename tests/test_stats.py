"""Shared statistics helpers, checked against direct computations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from evalkit.metrics.stats import mcnemar_flips, paired_bootstrap_diff, wilson_ci


def _wilson_by_formula(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(7, 20), (0, 20), (20, 20), (57, 100)])
def test_wilson_matches_formula(k: int, n: int) -> None:
    lo, hi = wilson_ci(k, n)
    exp_lo, exp_hi = _wilson_by_formula(k, n)
    assert lo == pytest.approx(max(0.0, exp_lo), abs=1e-9)
    assert hi == pytest.approx(min(1.0, exp_hi), abs=1e-9)


def test_wilson_without_trials_is_nan() -> None:
    assert all(math.isnan(x) for x in wilson_ci(0, 0))


def test_mcnemar_flips_on_hand_made_outcomes() -> None:
    # 12 questions: 4 both right, 6 right->wrong, 1 wrong->right, 1 both wrong.
    ref = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    dep = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    f = mcnemar_flips([bool(x) for x in ref], [bool(x) for x in dep])
    assert (f.n, f.both_right, f.right_to_wrong, f.wrong_to_right, f.both_wrong) == (12, 4, 6, 1, 1)
    assert f.flipped == 7
    assert f.flip_rate == pytest.approx(7 / 12)
    assert f.right_to_wrong_rate == pytest.approx(6 / 12)
    assert f.wrong_to_right_rate == pytest.approx(1 / 12)
    # Exact McNemar = two-sided sign test on the 7 discordant pairs: 2 * P(X <= 1), X ~ Bin(7, 1/2).
    assert f.p_value == pytest.approx(2 * (1 + 7) / 2**7)


def test_mcnemar_without_flips_is_one() -> None:
    f = mcnemar_flips([True, False, True], [True, False, True])
    assert f.flipped == 0 and f.p_value == 1.0


def test_mcnemar_rejects_unpaired() -> None:
    with pytest.raises(ValueError):
        mcnemar_flips([True], [True, False])


def test_paired_bootstrap_mean_difference_and_ci() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(0.0, 1.0, 200)
    dep = ref + 0.3 + rng.normal(0.0, 0.2, 200)  # paired: the shared item effect cancels
    res = paired_bootstrap_diff(dep, ref)
    d = dep - ref
    assert res.diff == pytest.approx(d.mean())
    se = d.std(ddof=1) / math.sqrt(d.size)
    # For n=200 the bootstrap CI agrees with the normal-theory paired interval to well within one SE.
    assert res.ci_low == pytest.approx(d.mean() - 1.96 * se, abs=0.5 * se)
    assert res.ci_high == pytest.approx(d.mean() + 1.96 * se, abs=0.5 * se)
    assert res.excludes_zero and res.n == 200


def test_paired_bootstrap_degenerate_cases() -> None:
    same = paired_bootstrap_diff([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert (same.diff, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0) and not same.excludes_zero
    one = paired_bootstrap_diff([0.7], [0.2])
    assert one.diff == pytest.approx(0.5) and one.ci_low is None and one.n == 1
    with pytest.raises(ValueError):
        paired_bootstrap_diff([1.0, 2.0], [1.0])
