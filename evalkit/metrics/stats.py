"""Paired statistics, written once for every suite: intervals, paired tests and the significance rule.

Conventions (all suites): differences are deployment minus reference on the same items; one `alpha`
from the config (`stats:`), so every interval is a (1 - alpha) interval; a difference is significant
when its interval excludes 0 (`excludes_zero`), whatever the method. NaN/None mean "cannot say".

Three paired comparisons, chosen per metric by its declaration (`metrics.declarations`):
- pass/fail items ("mcnemar"): exact McNemar test on the flips, the interval of the difference that
  inverts it (Clopper-Pearson on the discordant pairs), the paired bootstrap interval beside it, and
  the flip shares with Wilson intervals;
- continuous per-item values ("paired_bootstrap"): paired bootstrap of the mean difference;
- corpus metrics ("corpus_bootstrap", BLEU/chrF): paired bootstrap resampling of items, recomputing
  the corpus score from summed sufficient statistics (sacrebleu's `paired_bs`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evalkit.memo import Memo


class StatsSettings(BaseModel):
    """One statistical policy for every paired comparison (config `stats:`; evalkit.config validates it).

    A difference is "significant" when its (1 - alpha) interval excludes 0, whatever the method.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.05, gt=0.0, lt=0.5)
    bootstrap_samples: int = Field(default=2000, ge=100, le=100_000)
    seed: int = Field(default=0, ge=0)  # numpy's Generator rejects negative seeds


DEFAULT = StatsSettings()
CONFIDENCE = 1.0 - DEFAULT.alpha  # default confidence level, for code without a config at hand


def _scipy_stats():  # type: ignore[no-untyped-def]
    """scipy.stats, imported on first use: it takes about a second to import, and every worker and CLI start
    imports the suites (hence this module) without computing a statistic."""
    from scipy import stats

    return stats


# scipy's answers kept by their arguments: a fully cached re-run scores the same records again, and importing
# scipy.stats for its few McNemar tests and bootstraps took longer than the rest of its scoring. Each answer is a
# pure function of the call's arguments and scipy's version, so it is read back bit for bit instead of recomputed.
# evalkit.scoring turns this on (the result cache's `scipy/`) for runs that use the result cache.
MEMO_FORMAT = 1  # the kept answers' key layout: a change computes them again
_SCIPY_ANSWERS = Memo(".json")


def scipy_memo(where: Path | None) -> ContextManager[None]:
    """Keep scipy's answers under `where` (None: compute every one) for the calls made inside the block."""
    return _SCIPY_ANSWERS.kept_under(where)


@lru_cache(maxsize=1)
def _scipy_version() -> str:
    from importlib.metadata import version  # not scipy.__version__: that imports scipy

    return version("scipy")


def _kept(call: str, args: list[Any], compute: Callable[[], list[Any]]) -> list[Any]:
    """compute(), or the answer kept for (call, args) under this scipy; floats survive JSON exactly (repr)."""
    key = json.dumps([MEMO_FORMAT, call, args, _scipy_version()]) if _SCIPY_ANSWERS.where is not None else ""

    def answers_key(blob: bytes) -> bool:  # a hash collision or a damaged file: compute again
        try:
            return json.loads(blob)["key"] == key
        except (ValueError, KeyError, TypeError):
            return False

    blob = _SCIPY_ANSWERS.answer(lambda: key, lambda: json.dumps({"key": key, "answer": compute()}).encode("utf-8"),
                                 answers_key)
    return list(json.loads(blob)["answer"])


def normal_two_sided_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic (scipy imported on first use, as above)."""
    z = abs(float(z))
    return _kept("normal_two_sided_p", [z], lambda: [float(2 * _scipy_stats().norm.sf(z))])[0]


def confidence_of(settings: StatsSettings | None = None) -> float:
    return 1.0 - (settings or DEFAULT).alpha


# scipy.stats.norm.ppf(0.975) to the last bit (tests/test_stats.py checks it): a run that needs only the default
# interval (perplexity of one deployment) then imports no scipy (about a second).
_Z_DEFAULT = 1.959963984540054


def z_value(alpha: float = DEFAULT.alpha) -> float:
    """Two-sided normal quantile for a (1 - alpha) interval (1.959964 at alpha = 0.05)."""
    if alpha == DEFAULT.alpha:
        return _Z_DEFAULT
    return float(_scipy_stats().norm.ppf(1.0 - alpha / 2.0))


def excludes_zero(low: float | None, high: float | None) -> bool:
    """The one significance rule: the (1 - alpha) interval of the difference lies entirely on one side of 0."""
    if low is None or high is None:
        return False
    lo, hi = float(low), float(high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    return lo > 0 or hi < 0


def normal_interval(value: float, se: float | None, alpha: float = DEFAULT.alpha) -> tuple[float | None, float | None]:
    """value ± z * se; (None, None) when the standard error is missing or not finite."""
    if se is None or not math.isfinite(se) or not math.isfinite(value):
        return None, None
    z = z_value(alpha)
    return value - z * se, value + z * se


def wilson_ci(k: int, n: int, alpha: float = DEFAULT.alpha) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (nan, nan) when n == 0.

    Wilson rather than Wald: it stays inside [0, 1] and behaves at k = 0 or k = n, which small
    per-subject samples (20 questions) hit often.
    """
    if n <= 0:
        return (math.nan, math.nan)
    # scipy.stats.binomtest(k, n).proportion_ci(method="wilson"), written out (scipy's _binom_wilson_conf_int, to
    # the last bit: tests/test_stats.py) so that no scipy.stats import is needed for it.
    k, n = int(k), int(n)
    confidence = 1.0 - alpha
    if confidence == 1.0 - DEFAULT.alpha:
        z = _Z_DEFAULT
    else:
        from scipy.special import ndtri

        z = float(ndtri(0.5 + 0.5 * confidence))
    p = k / n
    denom = 2 * (n + z**2)
    center = (2 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
    return (0.0 if k == 0 else center - delta, 1.0 if k == n else center + delta)


# -- continuous per-item values --------------------------------------------------------------------


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
        return excludes_zero(self.ci_low, self.ci_high)


def paired_bootstrap_diff(
    a: Sequence[float], b: Sequence[float], settings: StatsSettings | None = None, method: str = "BCa"
) -> PairedDiff:
    """Paired bootstrap CI of mean(a) - mean(b) (a = deployment, b = reference, same items, same order).

    Uses scipy.stats.bootstrap(paired=True): items are resampled together, so item difficulty cancels.
    Degenerate cases are answered directly instead of letting BCa return NaN with a warning:
    n < 2 -> no CI; all paired differences equal -> the CI is that single value.
    """
    s = settings or DEFAULT
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

    def interval() -> list[float]:
        res = _scipy_stats().bootstrap(
            (x, y), mean_diff, paired=True, vectorized=True, confidence_level=1.0 - s.alpha,
            n_resamples=s.bootstrap_samples, method=method, rng=np.random.default_rng(s.seed),
        )
        return [float(res.confidence_interval.low), float(res.confidence_interval.high)]

    low, high = _kept("bootstrap_mean_diff", [x.tolist(), y.tolist(), s.alpha, s.bootstrap_samples, s.seed, method],
                      interval)
    if not (math.isfinite(low) and math.isfinite(high)):  # BCa can fail on very lumpy data
        return paired_bootstrap_diff(a, b, s, method="percentile")
    return PairedDiff(diff, low, high, n, f"paired bootstrap ({method}, {s.bootstrap_samples} resamples)")


# -- pass/fail items -------------------------------------------------------------------------------


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
    r2w = int(np.sum(ref & ~dep))
    w2r = int(np.sum(~ref & dep))
    m = r2w + w2r
    # Exact McNemar = two-sided binomial (sign) test on the discordant pairs; no discordant pair -> 1.
    p = _kept("binomtest_p", [w2r, m], lambda: [float(_scipy_stats().binomtest(w2r, m, 0.5).pvalue)])[0] if m else 1.0
    return Flips(n=int(ref.size), both_right=int(np.sum(ref & dep)), both_wrong=int(np.sum(~ref & ~dep)),
                 right_to_wrong=r2w, wrong_to_right=w2r, p_value=p)


def mcnemar_interval(flips: Flips, alpha: float = DEFAULT.alpha) -> tuple[float | None, float | None]:
    """(1 - alpha) interval of accuracy(dep) - accuracy(ref) that inverts the exact McNemar test.

    Given m discordant pairs, wrong->right ~ Bin(m, pi) and the difference is (m/n)(2 pi - 1); the
    Clopper-Pearson interval of pi, mapped through that, excludes 0 exactly when McNemar's p < alpha.
    A paired bootstrap of a few pass/fail items is much narrower than the data allow (n = 8 with three
    right->wrong flips: the bootstrap excludes 0, McNemar p = 0.25), so this is the interval that decides.
    """
    n, m = flips.n, flips.flipped
    if n == 0:
        return None, None
    if m == 0:
        return 0.0, 0.0
    def exact() -> list[float]:
        ci = _scipy_stats().binomtest(flips.wrong_to_right, m, 0.5).proportion_ci(confidence_level=1.0 - alpha, method="exact")
        return [float(ci.low), float(ci.high)]

    low, high = _kept("clopper_pearson", [flips.wrong_to_right, m, alpha], exact)
    scale = m / n
    return scale * (2 * low - 1), scale * (2 * high - 1)


@dataclass(frozen=True)
class PassFail:
    """A pass/fail paired comparison: accuracies, their difference with the exact interval, flips."""

    value: float  # deployment's share correct
    reference_value: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    flips: Flips
    bootstrap: PairedDiff
    alpha: float

    @property
    def n(self) -> int:
        return self.flips.n

    @property
    def p_value(self) -> float:
        return self.flips.p_value

    @property
    def significant(self) -> bool:
        return excludes_zero(self.ci_low, self.ci_high)

    @property
    def method(self) -> str:
        b = self.bootstrap
        boot = f"[{b.ci_low:.3f}, {b.ci_high:.3f}]" if b.ci_low is not None and b.ci_high is not None else "none"
        return (f"CI: exact McNemar interval ({self.flips.flipped} discordant of {self.n}); "
                f"paired bootstrap CI {boot}; p: McNemar exact")

    def flip_shares(self) -> list[tuple[str, int, float, float]]:
        """(metric, count, wilson low, wilson high) for flip_rate and the two directions."""
        f = self.flips
        return [(name, k, *wilson_ci(k, f.n, self.alpha)) for name, k in
                (("flip_rate", f.flipped), ("flips_right_to_wrong", f.right_to_wrong),
                 ("flips_wrong_to_right", f.wrong_to_right))]


def compare_pass_fail(deployment_ok: Sequence[bool], reference_ok: Sequence[bool],
                      settings: StatsSettings | None = None) -> PassFail:
    """Paired pass/fail comparison on the same items (same order): deployment minus reference."""
    s = settings or DEFAULT
    dep = [bool(x) for x in deployment_ok]
    ref = [bool(x) for x in reference_ok]
    flips = mcnemar_flips(ref, dep)
    n = len(dep)
    boot = paired_bootstrap_diff([float(x) for x in dep], [float(x) for x in ref], s)
    lo, hi = mcnemar_interval(flips, s.alpha)
    value = sum(dep) / n if n else math.nan
    ref_value = sum(ref) / n if n else math.nan
    return PassFail(value, ref_value, value - ref_value, lo, hi, flips, boot, s.alpha)


# -- corpus metrics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusDiff:
    """score(dep) - score(ref) of a corpus metric, with a paired item-bootstrap interval and p-value."""

    reference_value: float
    value: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n: int
    method: str

    @property
    def significant(self) -> bool:
        return excludes_zero(self.ci_low, self.ci_high)


def bootstrap_indices(n: int, settings: StatsSettings | None = None) -> np.ndarray:
    """bootstrap_samples x n item indices drawn with replacement (shared by paired systems)."""
    s = settings or DEFAULT
    return np.random.default_rng(s.seed).integers(0, n, size=(s.bootstrap_samples, n))


ScoreFn = Callable[[np.ndarray], float]  # summed sufficient statistics -> corpus score


def _resampled(item_stats: np.ndarray, score: ScoreFn, idx: np.ndarray, block: int = 256) -> np.ndarray:
    """score() of each resample's summed statistics. Each distinct sum is scored once: resamples of few items
    repeat (6 items give at most 462 distinct multisets among 2000 resamples) and the score is the costly part."""
    sums = np.concatenate([item_stats[idx[b : b + block]].sum(axis=1) for b in range(0, len(idx), block)])
    distinct, where = np.unique(sums, axis=0, return_inverse=True)
    return np.array([score(row) for row in distinct])[where.reshape(-1)]


def corpus_bootstrap_ci(item_stats: np.ndarray, score: ScoreFn,
                        settings: StatsSettings | None = None) -> tuple[float | None, float | None]:
    """Percentile (1 - alpha) interval of a corpus score over resampled items; None below 2 items."""
    s = settings or DEFAULT
    st = np.asarray(item_stats, dtype=float)
    if len(st) < 2:
        return None, None
    boots = _resampled(st, score, bootstrap_indices(len(st), s))
    lo, hi = np.percentile(boots, [100 * s.alpha / 2, 100 * (1 - s.alpha / 2)])
    return float(lo), float(hi)


def corpus_paired_bootstrap(dep_stats: np.ndarray, ref_stats: np.ndarray, score: ScoreFn,
                            settings: StatsSettings | None = None) -> CorpusDiff:
    """Paired bootstrap of a corpus metric (sacrebleu's paired_bs, Koehn 2004): both systems are
    rescored on the same resampled items. Interval: percentiles of the resampled differences.
    p: two-sided, the share of resampled differences, shifted to mean 0, at least as far from 0 as the
    observed difference ((count + 1) / (B + 1))."""
    s = settings or DEFAULT
    d_st, r_st = np.asarray(dep_stats, dtype=float), np.asarray(ref_stats, dtype=float)
    if d_st.shape != r_st.shape:
        raise ValueError(f"paired statistics must have the same shape (got {d_st.shape} and {r_st.shape})")
    n = len(d_st)
    value, ref_value = score(d_st.sum(axis=0)), score(r_st.sum(axis=0))
    diff = value - ref_value
    if n < 2:
        return CorpusDiff(ref_value, value, diff, None, None, None, n, "difference only (n < 2)")
    idx = bootstrap_indices(n, s)
    diffs = _resampled(d_st, score, idx) - _resampled(r_st, score, idx)
    lo, hi = np.percentile(diffs, [100 * s.alpha / 2, 100 * (1 - s.alpha / 2)])
    shifted = np.abs(diffs - diffs.mean())
    p = float((np.sum(shifted >= abs(diff)) + 1) / (len(diffs) + 1))
    method = f"paired item bootstrap ({s.bootstrap_samples} resamples, percentile CI); p: shifted bootstrap"
    return CorpusDiff(ref_value, value, diff, float(lo), float(hi), p, n, method)


# -- clustered means (several ratings per item) ----------------------------------------------------


@dataclass(frozen=True)
class ClusteredMean:
    mean: float
    ci_low: float
    ci_high: float
    method: str


def clustered_mean(sums: Sequence[float], counts: Sequence[float], settings: StatsSettings | None = None) -> ClusteredMean:
    """Mean of all values with a bootstrap CI that resamples whole clusters (items), as a ratio estimator.

    Two raters scoring the same output are not two independent observations, so each resample draws
    items with all their values: mean = sum of the drawn items' sums / sum of their counts.
    """
    s = settings or DEFAULT
    sm, cn = np.asarray(sums, dtype=float), np.asarray(counts, dtype=float)
    mean = float(sm.sum() / cn.sum())
    if len(sm) < 2:
        return ClusteredMean(mean, math.nan, math.nan, "mean only (n_items < 2)")
    if np.allclose(sm / cn, mean):
        return ClusteredMean(mean, mean, mean, "exact (every item has the same mean)")

    def ratio(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        idx = idx.astype(int)
        return sm[idx].sum(axis=axis) / cn[idx].sum(axis=axis)

    for method in ("BCa", "percentile"):  # BCa first; percentile when BCa cannot form an interval
        res = _scipy_stats().bootstrap((np.arange(len(sm)),), ratio, vectorized=True, n_resamples=s.bootstrap_samples,
                              confidence_level=1.0 - s.alpha, method=method, rng=np.random.default_rng(s.seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return ClusteredMean(mean, low, high, f"item bootstrap ({method}, {s.bootstrap_samples} resamples)")
    return ClusteredMean(mean, math.nan, math.nan, "no CI (bootstrap failed)")
