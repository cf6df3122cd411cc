"""Shared statistics helpers, checked against direct computations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scipy import stats as sps

from evalkit.config import StatsSettings
from evalkit.metrics.stats import (
    compare_pass_fail, corpus_paired_bootstrap, excludes_zero, mcnemar_flips, mcnemar_interval, paired_bootstrap_diff,
    wilson_ci, z_value,
)


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


def test_wilson_uses_alpha() -> None:
    # 90% interval: z = 1.6448536 (normal table), by the formula.
    lo, hi = wilson_ci(7, 20, alpha=0.10)
    exp_lo, exp_hi = _wilson_by_formula(7, 20, z=1.6448536269514722)
    assert (lo, hi) == (pytest.approx(exp_lo, abs=1e-9), pytest.approx(exp_hi, abs=1e-9))


def test_z_value_from_normal_table() -> None:
    assert z_value(0.05) == pytest.approx(1.959963984540054)
    assert z_value(0.10) == pytest.approx(1.6448536269514722)
    assert z_value(0.01) == pytest.approx(2.5758293035489004)


def test_significance_rule_is_interval_excludes_zero() -> None:
    assert excludes_zero(0.01, 0.2) and excludes_zero(-0.3, -0.001)
    assert not excludes_zero(-0.1, 0.2) and not excludes_zero(0.0, 0.3) and not excludes_zero(0.0, 0.0)
    assert not excludes_zero(None, 0.2) and not excludes_zero(float("nan"), -1.0)


def test_mcnemar_p_by_hand_one_sided_flips() -> None:
    # 5 right->wrong, 0 wrong->right: two-sided sign test 2 * (1/2)^5 = 0.0625 (not below 0.05).
    f = mcnemar_flips([True] * 5 + [False] * 3, [False] * 5 + [False] * 3)
    assert f.p_value == pytest.approx(0.0625)
    # 9 vs 1: 2 * (1 + 10) / 2^10 = 0.021484375.
    g = mcnemar_flips([True] * 9 + [False] * 1 + [True] * 5, [False] * 9 + [True] * 1 + [True] * 5)
    assert g.p_value == pytest.approx(22 / 1024)


def _clopper_pearson(x: int, m: int, alpha: float) -> tuple[float, float]:
    """Textbook Clopper-Pearson bounds from beta quantiles."""
    lo = 0.0 if x == 0 else sps.beta.ppf(alpha / 2, x, m - x + 1)
    hi = 1.0 if x == m else sps.beta.ppf(1 - alpha / 2, x + 1, m - x)
    return float(lo), float(hi)


def test_mcnemar_interval_is_clopper_pearson_on_discordant_pairs() -> None:
    # 12 items, 6 right->wrong, 1 wrong->right: m = 7 discordant, difference = (1 - 6) / 12.
    f = mcnemar_flips([True] * 10 + [False] * 2, [True] * 4 + [False] * 6 + [True, False])
    lo, hi = mcnemar_interval(f, 0.05)
    cp_lo, cp_hi = _clopper_pearson(1, 7, 0.05)
    assert lo == pytest.approx(7 / 12 * (2 * cp_lo - 1)) and hi == pytest.approx(7 / 12 * (2 * cp_hi - 1))
    assert lo < -5 / 12 < hi


@pytest.mark.parametrize("alpha", [0.05, 0.10])
def test_pass_fail_interval_agrees_with_exact_mcnemar(alpha: float) -> None:
    """Over every flip table with up to 12 discordant pairs: the interval excludes 0 iff McNemar p < alpha."""
    settings = StatsSettings(alpha=alpha, bootstrap_samples=200)
    for r2w in range(0, 13):
        for w2r in range(0, 13 - r2w):
            ref = [True] * r2w + [False] * w2r + [True] * 10 + [False] * 4
            dep = [False] * r2w + [True] * w2r + [True] * 10 + [False] * 4
            res = compare_pass_fail(dep, ref, settings)
            assert res.diff == pytest.approx((w2r - r2w) / len(ref))
            assert res.significant == (res.p_value < alpha), (r2w, w2r, res.p_value, res.ci_low, res.ci_high)


def test_pass_fail_small_sample_not_called_significant() -> None:
    # 8 questions, 3 right->wrong: McNemar p = 2 / 2^3 = 0.25; the paired bootstrap alone would exclude 0.
    res = compare_pass_fail([False] * 3 + [True] * 5, [True] * 8)
    assert res.p_value == pytest.approx(0.25)
    assert not res.significant
    assert res.bootstrap.ci_high is not None and res.bootstrap.ci_high < 0
    shares = {name: (k, lo, hi) for name, k, lo, hi in res.flip_shares()}
    assert shares["flips_right_to_wrong"][0] == 3 and shares["flips_wrong_to_right"][0] == 0
    exp = _wilson_by_formula(3, 8)
    assert shares["flip_rate"][1:] == (pytest.approx(exp[0]), pytest.approx(exp[1]))


def test_corpus_paired_bootstrap_matches_normal_theory_for_a_mean() -> None:
    """A corpus 'metric' that is a plain mean (stats = [x, 1]): the paired bootstrap interval and p
    must agree with the paired normal-theory interval and z-test at n = 400."""
    rng = np.random.default_rng(7)
    ref = rng.normal(10.0, 2.0, 400)
    dep = ref - 0.2 + rng.normal(0.0, 1.0, 400)
    d = dep - ref
    se = d.std(ddof=1) / math.sqrt(d.size)

    def score(summed: np.ndarray) -> float:
        return float(summed[0] / summed[1])

    res = corpus_paired_bootstrap(np.c_[dep, np.ones(400)], np.c_[ref, np.ones(400)], score,
                                  StatsSettings(bootstrap_samples=4000, seed=1))
    assert res.diff == pytest.approx(d.mean())
    assert res.ci_low == pytest.approx(d.mean() - 1.96 * se, abs=0.25 * se)
    assert res.ci_high == pytest.approx(d.mean() + 1.96 * se, abs=0.25 * se)
    p_normal = 2 * sps.norm.sf(abs(d.mean()) / se)
    assert res.p_value == pytest.approx(p_normal, abs=0.01)
    assert res.significant == (p_normal < 0.05)


def test_default_z_is_scipys_quantile_to_the_last_bit() -> None:
    from evalkit.metrics.stats import z_value

    assert z_value() == z_value(0.05) == float(sps.norm.ppf(0.975))
    assert z_value(0.1) == float(sps.norm.ppf(0.95))


@pytest.mark.parametrize("alpha", [0.05, 0.10])
def test_wilson_is_scipys_interval_to_the_last_bit(alpha: float) -> None:
    for n in range(1, 41):
        for k in range(n + 1):
            ci = sps.binomtest(k, n).proportion_ci(confidence_level=1.0 - alpha, method="wilson")
            assert wilson_ci(k, n, alpha) == (float(ci.low), float(ci.high)), (k, n)


def test_kept_scipy_answers_are_read_back_bit_for_bit_without_scipy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    # One pass/fail comparison with discordant pairs (McNemar p, Clopper-Pearson, BCa bootstrap), computed with
    # the memo on in one process and read back in another, which must not import scipy.stats to answer it.
    code = f"""
import sys
from pathlib import Path
from evalkit.metrics.stats import compare_pass_fail, scipy_memo
dep = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0]
ref = [1, 1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1]
with scipy_memo(Path({str(tmp_path)!r})):
    r = compare_pass_fail(dep, ref)
print(repr((r.p_value, r.ci_low, r.ci_high, r.bootstrap.ci_low, r.bootstrap.ci_high)))
print("scipy.stats" in sys.modules)
"""
    first, second = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
                     for _ in range(2))
    direct = compare_pass_fail([1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1])
    expected = repr((direct.p_value, direct.ci_low, direct.ci_high, direct.bootstrap.ci_low, direct.bootstrap.ci_high))
    assert first[:2] == [expected, "True"] and second[:2] == [expected, "False"]
    assert len(list(tmp_path.glob("*.json"))) == 3
