"""Shared statistics helpers, checked against direct computations."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scipy import stats as sps

from evalkit.config import StatsSettings
from evalkit.metrics.stats import (
    compare_pass_fail, corpus_paired_bootstrap, excludes_zero, mcnemar_flips, paired_mean_diff, paired_proportion_interval,
    tango_interval,
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


def test_paired_mean_difference_is_the_t_interval_for_symmetric_differences() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(0.0, 1.0, 200)
    dep = ref + 0.3 + rng.normal(0.0, 0.2, 200)  # paired: the shared item effect cancels
    res = paired_mean_diff(dep, ref)
    d = dep - ref
    assert res.diff == pytest.approx(d.mean())
    se = d.std(ddof=1) / math.sqrt(d.size)
    # Near-symmetric differences: Hall's correction is small, the ends are the t interval's (t_0.975,199 = 1.97196).
    assert res.ci_low == pytest.approx(d.mean() - 1.97196 * se, abs=0.05 * se)
    assert res.ci_high == pytest.approx(d.mean() + 1.97196 * se, abs=0.05 * se)
    assert res.excludes_zero and res.n == 200


def test_paired_mean_difference_leans_with_skewed_differences() -> None:
    """Most items unchanged, a few much worse (a quantized model's usual shape): the interval reaches further
    towards the long tail than the t interval, and less far on the other side."""
    d = np.r_[np.zeros(45), -np.ones(5) * 4.0]
    res = paired_mean_diff(d, np.zeros(50))
    se = d.std(ddof=1) / math.sqrt(d.size)
    t = float(sps.t.ppf(0.975, 49))
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low < d.mean() - t * se and res.ci_high < d.mean() + t * se


def test_paired_mean_difference_gives_no_interval_it_cannot_stand_behind() -> None:
    same = paired_mean_diff([1.0, 0.0, 1.0] * 20, [1.0, 0.0, 1.0] * 20)
    assert same.diff == 0.0 and same.ci_low is None and not same.excludes_zero and "spread unknown" in same.method
    few = paired_mean_diff(np.arange(49.0), np.zeros(49))
    assert few.ci_low is None and few.method.startswith("too few items for an interval")
    one = paired_mean_diff([0.7], [0.2])
    assert one.diff == pytest.approx(0.5) and one.ci_low is None and one.n == 1
    with pytest.raises(ValueError):
        paired_mean_diff([1.0, 2.0], [1.0])


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


def test_tango_interval_reproduces_the_published_worked_example() -> None:
    """Fagerland, Lydersen and Laake (Statistics in Medicine 2014; also their book's chapter 8 and the R package
    contingencytables): complete response before and after consolidation therapy (Cavo et al. 2012), 59 / 6 /
    16 / 80 pairs: difference -0.0621, Tango's asymptotic score interval -0.1240 to -0.0054."""
    lo, hi = paired_proportion_interval(6, 16, 161, 0.05, continuity=0.0)
    assert round((6 - 16) / 161, 4) == -0.0621
    assert (round(float(lo), 4), round(float(hi), 4)) == (-0.1240, -0.0054)


@pytest.mark.parametrize("n, continuity", [(40, 0.0), (40, 0.25), (6, 0.25), (1000, 0.25)])
def test_no_discordant_pair_gives_the_hand_solved_interval_not_zero_width(n: int, continuity: float) -> None:
    # No flip: Tango's restricted flip rate is 0 for delta > 0, so the upper end solves
    # (n d - c)^2 = z^2 n d (1 - d), a quadratic in d written out here; the interval is symmetric.
    z = float(sps.norm.ppf(0.975))
    qa, qb, qc = n * n + z * z * n, -(2 * n * continuity + z * z * n), continuity**2
    upper = (-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa)
    f = mcnemar_flips([True] * (n // 2) + [False] * (n - n // 2), [True] * (n // 2) + [False] * (n - n // 2))
    lo, hi = tango_interval(f, 0.05, continuity)
    assert hi == pytest.approx(upper, rel=1e-12) and lo == pytest.approx(-upper, rel=1e-12)
    assert hi > 0.05 if n == 40 else True  # 40 items cannot rule out a 5-point loss


def test_tango_interval_is_the_inversion_of_its_score_test() -> None:
    """At each end the statistic equals the normal quantile; just outside it rejects, just inside it does not."""
    from evalkit.metrics.stats import _tango_statistic

    z = float(sps.norm.ppf(0.975))
    for w2r, r2w, n in [(0, 3, 40), (1, 6, 12), (5, 0, 8), (16, 6, 161), (0, 1, 6), (40, 60, 1000)]:
        lo, hi = paired_proportion_interval(w2r, r2w, n)
        assert -1 <= lo <= (w2r - r2w) / n <= hi <= 1
        stat = lambda d: float(_tango_statistic(*(np.asarray(v, dtype=float) for v in (w2r, r2w, n, d)), 0.25))  # noqa: E731
        if lo > -1:
            assert stat(lo - 1e-9) > z >= stat(lo + 1e-9)
        if hi < 1:
            assert stat(hi + 1e-9) < -z <= stat(hi - 1e-9)


def test_one_way_flips_give_a_lower_end_below_the_estimate() -> None:
    # The QA case: 6 items, one right->wrong flip. McNemar's conditional interval gave [-16.7, 15.8]
    # points (its lower end was the estimate itself); an unconditional interval must reach below it.
    res = compare_pass_fail([False] + [True] * 3 + [False] * 2, [True] * 4 + [False] * 2)
    assert res.diff == pytest.approx(-1 / 6)
    assert res.ci_low is not None and res.ci_high is not None
    assert res.ci_low < res.diff - 0.2 and res.ci_high > 0


def test_pass_fail_small_sample_not_called_significant() -> None:
    # 8 questions, 3 right->wrong: McNemar p = 2 / 2^3 = 0.25; the paired bootstrap alone would exclude 0.
    res = compare_pass_fail([False] * 3 + [True] * 5, [True] * 8)
    assert res.p_value == pytest.approx(0.25)
    assert not res.significant
    assert res.ci_low is not None and res.ci_high is not None and res.ci_low < res.diff < 0 < res.ci_high
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
    from evalkit.metrics.stats import Z_POWER_80

    assert Z_POWER_80 == float(sps.norm.ppf(0.8))


@pytest.mark.parametrize("alpha", [0.05, 0.10])
def test_wilson_is_scipys_interval_to_the_last_bit(alpha: float) -> None:
    for n in range(1, 41):
        for k in range(n + 1):
            ci = sps.binomtest(k, n).proportion_ci(confidence_level=1.0 - alpha, method="wilson")
            assert wilson_ci(k, n, alpha) == (float(ci.low), float(ci.high)), (k, n)


def test_scipy_stats_answers_from_scipy_special_are_scipy_stats_to_the_last_bit() -> None:
    """The p-values and quantiles evalkit computes without importing scipy.stats equal scipy.stats' own, bit for
    bit: the normal tail and quantile, Student's t quantile at every df a paired interval meets, and the exact
    two-sided binomial test (McNemar's) at every k of every n up to 100, then at seeded random (k, n) up to 20,000."""
    from evalkit.metrics.stats import binomial_two_sided_p, normal_quantile, normal_two_sided_p, t_quantile

    for z in np.linspace(0.0, 9.0, 1801):
        assert normal_two_sided_p(z) == normal_two_sided_p(-z) == float(2 * sps.norm.sf(z)), z
    for p in (0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 0.995, 1e-6):
        assert normal_quantile(p) == float(sps.norm.ppf(p)), p
        for df in (*range(1, 400), 1000, 10_000, 100_000):
            assert t_quantile(p, df) == float(sps.t.ppf(p, df)), (p, df)
    pairs = [(k, n) for n in range(101) for k in range(n + 1)]
    rng = np.random.default_rng(0)
    pairs += [(int(rng.integers(0, n + 1)), int(n)) for n in rng.integers(101, 20_000, 200)]
    for k, n in pairs:
        expected = 1.0 if n == 0 else float(sps.binomtest(k, n, 0.5).pvalue)
        assert binomial_two_sided_p(k, n) == expected, (k, n)


def test_scoring_a_recorded_run_imports_no_scipy_stats(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Re-scoring a real recorded run (tests/data/run-v0: pass/fail comparisons with discordant pairs, paired
    intervals) in a fresh process: the same comparison figures as this process computes, and scipy.stats (half a
    CPU-second to import, in every evalkit run) never imported."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from evalkit.scoring import COMPARISONS_CSV, SCORES_CSV, score_run
    from evalkit.store import RunDir

    fixture = Path(__file__).parent / "data" / "run-v0"
    here, there = tmp_path / "here", tmp_path / "there"
    for run in (here, there):
        shutil.copytree(fixture, run, ignore=shutil.ignore_patterns(SCORES_CSV, COMPARISONS_CSV))
    code = f"""
import sys
from evalkit.scoring import score_run
from evalkit.store import RunDir
score_run(RunDir.open({str(there)!r}))
print("scipy.stats" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    score_run(RunDir.open(here))
    compared = (here / COMPARISONS_CSV).read_text(encoding="utf-8")
    assert "mcnemar" in compared.lower() or "tango" in compared.lower(), compared[:500]  # pass/fail comparisons ran
    assert (there / COMPARISONS_CSV).read_text(encoding="utf-8") == compared
    assert proc.stdout.split() == ["False"]
