"""Paired statistics, written once for every suite: intervals, paired tests and the significance rule.

Conventions (all suites): differences are deployment minus reference on the same items; one `alpha`
from the config (`stats:`), so every interval is a (1 - alpha) interval; a difference is significant
when its interval excludes 0 (`excludes_zero`), whatever the method. NaN/None mean "cannot say".

Three paired comparisons, chosen per metric by its declaration (`metrics.declarations`):
- pass/fail items ("mcnemar"): Tango's unconditional score interval of the difference, McNemar's exact
  test for "significant", and the flip shares with Wilson intervals;
- continuous per-item values ("paired_bootstrap"): Hall's skewness-corrected t interval of the mean
  difference, from 40 paired items on;
- corpus metrics ("corpus_bootstrap", BLEU/chrF): paired bootstrap resampling of items, recomputing
  the corpus score from summed sufficient statistics (sacrebleu's `paired_bs`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


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


def _scipy_stats() -> Any:
    """scipy.stats, imported on first use and only for the bootstrap (clustered_mean): it takes about half a CPU-second
    to import, every evalkit process imports this module, and its other answers come from scipy.special below."""
    from scipy import stats

    return stats


# scipy.stats' answers, computed as scipy.stats computes them but from scipy.special alone (half of scipy.stats'
# import time): norm.sf is ndtr(-z), norm.ppf is ndtri, t.ppf is stdtrit, and binomtest's two-sided p-value is its
# algorithm (scipy/stats/_binomtest.py as of scipy 1.17) on the Boost binomial functions binom.pmf/cdf/sf call.
# The same bits as the installed scipy.stats: tests/test_stats.py compares every one over grids of arguments.
def normal_two_sided_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic: 2 * scipy.stats.norm.sf(|z|)."""
    from scipy.special import ndtr

    return float(2 * ndtr(-abs(float(z))))


def normal_quantile(p: float) -> float:
    """scipy.stats.norm.ppf(p)."""
    from scipy.special import ndtri

    return float(ndtri(p))


def t_quantile(p: float, df: int) -> float:
    """scipy.stats.t.ppf(p, df)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


def binomial_two_sided_p(k: int, n: int) -> float:
    """scipy.stats.binomtest(k, n, 0.5).pvalue: the probability of the outcomes no likelier than k (within scipy's
    relative 1e-7), the exact sign test McNemar's test is. 1 when n is 0."""
    if n == 0:
        return 1.0
    from scipy.special import _ufuncs

    pmf_, cdf_, sf_ = (getattr(_ufuncs, f"_binom_{f}", None) for f in ("pmf", "cdf", "sf"))
    if pmf_ is None or cdf_ is None or sf_ is None:  # a scipy without them: ask scipy.stats itself
        return float(_scipy_stats().binomtest(k, n, 0.5).pvalue)

    # binom.pmf/cdf/sf(x, n, 0.5) as rv_discrete answers them: 0 or 1 outside the support, else the Boost function.
    def pmf(x: int) -> float:
        return float(pmf_(float(x), float(n), 0.5)) if 0 <= x <= n else 0.0

    def cdf(x: int) -> float:
        return 0.0 if x < 0 else 1.0 if x >= n else float(cdf_(float(x), float(n), 0.5))

    def sf(x: int) -> float:
        return 1.0 if x < 0 else 0.0 if x >= n else float(sf_(float(x), float(n), 0.5))

    def last_at_most(a: Callable[[int], float], d: float, lo: int, hi: int) -> int:
        """The i in lo..hi with a(i) <= d < a(i + 1), a ascending (scipy's _binary_search_for_binom_tst)."""
        while lo < hi:
            mid = lo + (hi - lo) // 2
            value = a(mid)
            if value < d:
                lo = mid + 1
            elif value > d:
                hi = mid - 1
            else:
                return mid
        return lo if a(lo) <= d else lo - 1

    d = pmf(k)
    rerr = 1 + 1e-7
    if k == 0.5 * n:
        return 1.0
    if k < 0.5 * n:
        ix = last_at_most(lambda x: -pmf(x), -d * rerr, math.ceil(0.5 * n), n)
        y = n - ix + int(d * rerr == pmf(ix))
        p = cdf(k) + sf(n - y)
    else:
        y = last_at_most(pmf, d * rerr, 0, math.floor(0.5 * n)) + 1
        p = cdf(y - 1) + sf(k - 1)
    return min(1.0, p)


def confidence_of(settings: StatsSettings | None = None) -> float:
    return 1.0 - (settings or DEFAULT).alpha


# scipy.stats.norm.ppf(0.975) to the last bit (tests/test_stats.py checks it): a run that needs only the default
# interval (perplexity of one deployment) then imports no scipy (about a second).
Z_95 = 1.959963984540054
Z_POWER_80 = 0.8416212335729143  # scipy.stats.norm.ppf(0.8): a sample size's 80% power, checked in tests


def z_value(alpha: float = DEFAULT.alpha) -> float:
    """Two-sided normal quantile for a (1 - alpha) interval (1.959964 at alpha = 0.05)."""
    if alpha == DEFAULT.alpha:
        return Z_95
    return normal_quantile(1.0 - alpha / 2.0)


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
        z = Z_95
    else:
        z = normal_quantile(0.5 + 0.5 * confidence)
    p = k / n
    denom = 2 * (n + z**2)
    center = (2 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
    return (0.0 if k == 0 else center - delta, 1.0 if k == n else center + delta)


# -- continuous per-item values --------------------------------------------------------------------


# Below this many paired items no interval for a mean difference is printed or decided on: in the coverage
# study (tests/test_coverage.py) Hall's interval covers at least 93.5% from 50 items on for every shape of
# per-item differences tried (normal, exponential, log-normal, rating-like, three-valued, mostly zero), and no
# method tried (t, Hall, the BCa bootstrap this replaced) did at every shape below it: at 40 items a log-normal
# mean is covered 91.8% (t) or 93.4% (Hall) of the time; at 20 items differences that are mostly zero 80-85%.
MIN_ITEMS_FOR_INTERVAL = 50
# Corpus scores (BLEU, chrF: functions of summed per-item statistics) with the paired percentile bootstrap: at 40
# items a ratio of sums with a skewed per-item shift was covered 87.5% of the time, at 100 items 92%, at 200 94%.
MIN_ITEMS_FOR_CORPUS_INTERVAL = 200
TOO_FEW_ITEMS = "too few items for an interval"


@dataclass(frozen=True)
class PairedDiff:
    """mean(a) - mean(b) over paired observations, with its interval (None when it cannot be formed)."""

    diff: float
    ci_low: float | None
    ci_high: float | None
    n: int
    method: str

    @property
    def excludes_zero(self) -> bool:
        return excludes_zero(self.ci_low, self.ci_high)


def _t_quantile(alpha: float, df: int) -> float:
    return t_quantile(1.0 - alpha / 2.0, df)


def paired_mean_diff(a: Sequence[float], b: Sequence[float], settings: StatsSettings | None = None) -> PairedDiff:
    """(1 - alpha) interval of mean(a) - mean(b) over paired items (a = deployment, b = reference, same order).

    Hall's skewness-corrected t interval (P. Hall, "On the removal of skewness by transformation", JRSS B
    54:221-228, 1992) on the per-item differences d: with g = skewness(d) / sqrt(n) and the t quantile q, the
    ends are mean(d) - s / sqrt(n) * h(+-q), h(x) = 3 / g * (cbrt(1 + g * (x - g / 6)) - 1) the inverse of Hall's
    cubic transformation (h(x) = x - g / 6 at g = 0: the plain t interval). Per-item quality changes of a
    quantized model are skewed (most items barely move, a few move far); the plain t interval undercovers them.
    Below MIN_ITEMS_FOR_INTERVAL items, or when every paired difference is equal (the spread is unknown), there
    is no interval. Sums are correctly rounded (math.fsum) and the rest is scalar: every host gets the same bits.
    """
    s = settings or DEFAULT
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and the same length (got {x.shape} and {y.shape})")
    n = int(x.size)
    if n == 0:
        return PairedDiff(math.nan, None, None, 0, "none (no items)")
    d = [float(v) for v in x - y]
    mean = math.fsum(d) / n
    if n < MIN_ITEMS_FOR_INTERVAL:
        return PairedDiff(mean, None, None, n, f"{TOO_FEW_ITEMS} ({n} < {MIN_ITEMS_FOR_INTERVAL} paired items)")
    centred = [v - mean for v in d]
    m2 = math.fsum(c * c for c in centred) / n
    if m2 == 0.0:
        return PairedDiff(mean, None, None, n, "no interval (every paired difference is equal: spread unknown)")
    skew = math.fsum(c * c * c for c in centred) / n / m2**1.5
    sd = math.sqrt(m2 * n / (n - 1))
    low, high = _hall_interval(mean, sd / math.sqrt(n), skew / math.sqrt(n), _t_quantile(s.alpha, n - 1))
    return PairedDiff(mean, low, high, n, f"Hall's skewness-corrected t interval ({n} paired items)")


def _hall_interval(mean: float, se: float, g: float, q: float) -> tuple[float, float]:
    """Hall's (1992) interval: mean - se * h(+-q), h the inverse of his cubic transformation for skewness/sqrt(n) g."""

    def inverse(x: float) -> float:
        if abs(g) < 1e-12:
            return x - g / 6.0
        return 3.0 / g * (math.cbrt(1.0 + g * (x - g / 6.0)) - 1.0)

    return mean - se * inverse(q), mean - se * inverse(-q)


# -- token-level figures of a long text (perplexity, KLD, top-1 agreement) ---------------------------------------

# Tokens of one text are not independent: a hard passage raises every NLL and KLD in it. The decision's intervals
# on them treat consecutive runs of TOKEN_BLOCK tokens inside a chunk as the independent units (clusters); the
# coverage study in tests/test_coverage.py shows the token-level standard error (llama-perplexity's) covering 45-81%
# of the time on autocorrelated, KLD-like token series of 4-8 chunks where this one covers 93-95%, from 16 blocks
# (the default config's 4 chunks of 255 scored tokens) on. Blocks shorter than the correlation undercover (32
# tokens: 91% on the strongest series tried), so the block is long and the t quantile pays for few of them.
TOKEN_BLOCK = 64
MIN_TOKEN_BLOCKS = 16


@dataclass(frozen=True)
class BlockMean:
    """Mean over every token of several chunks, with its block-clustered interval (None below MIN_TOKEN_BLOCKS)."""

    mean: float
    ci_low: float | None
    ci_high: float | None
    n_tokens: int
    blocks: int
    chunks: int

    @property
    def method(self) -> str:
        where = f"{self.blocks} blocks of up to {TOKEN_BLOCK} tokens in {self.chunks} chunks"
        if self.ci_low is None and self.blocks < MIN_TOKEN_BLOCKS:
            return f"too few blocks for an interval ({where}; {MIN_TOKEN_BLOCKS} needed)"
        if self.ci_low == self.ci_high:
            return f"exact: every block's figure is the same ({where})"
        return f"block-clustered Hall t interval over {where} ({self.n_tokens} tokens)"


def block_clustered_mean(per_chunk: Sequence[Sequence[float] | np.ndarray], alpha: float = DEFAULT.alpha) -> BlockMean:
    """Mean of per-token values over chunks, with a cluster-robust interval whose clusters are runs of
    TOKEN_BLOCK consecutive tokens within a chunk (a chunk's last, shorter run is a cluster too).

    The ratio estimator's linearised variance: with block sums S_b and sizes N_b, m = sum S / sum N and
    var(m) = G / (G - 1) * sum (S_b - m N_b)^2 / (sum N)^2 over G blocks; the t quantile has G - 1 degrees of
    freedom, and Hall's skewness correction (as in paired_mean_diff) uses the skewness of S_b - m N_b: per-token
    KLD is heavy-tailed, and so are its block sums. Sums are math.fsum's, so every host gets the same bits.
    """
    sums: list[float] = []
    sizes: list[int] = []
    chunks = 0
    for values in per_chunk:
        v = [float(x) for x in values]
        if not v:
            continue
        chunks += 1
        for start in range(0, len(v), TOKEN_BLOCK):
            part = v[start:start + TOKEN_BLOCK]
            sums.append(math.fsum(part))
            sizes.append(len(part))
    total = sum(sizes)
    if total == 0:
        return BlockMean(math.nan, None, None, 0, 0, 0)
    mean = math.fsum(sums) / total
    g = len(sums)
    if g < MIN_TOKEN_BLOCKS:
        return BlockMean(mean, None, None, total, g, chunks)
    residuals = [sb - mean * nb for sb, nb in zip(sums, sizes)]
    m2 = math.fsum(r * r for r in residuals) / g
    if m2 == 0.0:  # every block's figure the same (one engine against itself, to the bit): exact on this text
        return BlockMean(mean, mean, mean, total, g, chunks)
    se = math.sqrt(g / (g - 1) * m2 * g) / total
    skew = math.fsum(r * r * r for r in residuals) / g / m2**1.5
    low, high = _hall_interval(mean, se, skew / math.sqrt(g), _t_quantile(alpha, g - 1))
    return BlockMean(mean, low, high, total, g, chunks)


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
    p = binomial_two_sided_p(w2r, m)
    return Flips(n=int(ref.size), both_right=int(np.sum(ref & dep)), both_wrong=int(np.sum(~ref & ~dep)),
                 right_to_wrong=r2w, wrong_to_right=w2r, p_value=p)


# Tango's score interval with this continuity adjustment (in discordant pairs) is what the decision reads. The
# coverage study in tests/test_coverage.py chose it: uncorrected, Tango's interval covers 92.8% at 40 items with
# one-way flips at a rate of 0.2 and 93.2% at 400 items with one-way flips at 0.01 (exact enumeration); with 0.25
# every (n, flip pattern) of the study covers at least 94.4% and its lower bound passes a margin equal to the
# truth at most 2.5% of the time. ratesci's pairbinci offers the same adjustment (its `cc`).
TANGO_CONTINUITY = 0.25
_BISECTIONS = 64  # halvings of [-1, 1]: past float64's resolution of the endpoints


def _tango_restricted_flip_rate(w2r: Any, r2w: Any, n: Any, delta: Any) -> Any:
    """Tango's restricted maximum-likelihood probability of a right->wrong flip under H0: difference = delta (the
    positive root of his quadratic), from counts of n items or, with n = 1, from per-item rates."""
    a = 2.0 * n
    b = -w2r - r2w + (2.0 * n - w2r + r2w) * delta
    c = -r2w * delta * (1.0 - delta)
    return (np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)


def _tango_statistic(w2r: np.ndarray, r2w: np.ndarray, n: np.ndarray, delta: np.ndarray,
                     continuity: float) -> np.ndarray:
    """Tango's (1998) score statistic for H0: accuracy(dep) - accuracy(ref) = delta, per element.

    (w2r - r2w - n*delta) / sqrt(n * (2 q + delta * (1 - delta))), q the maximum-likelihood probability of a
    right->wrong flip under H0 (the positive root of Tango's quadratic). The numerator moves `continuity`
    pairs towards 0. Only +, -, *, / and sqrt: IEEE-exact on every SIMD path, so every host gets the same bits.
    """
    q = _tango_restricted_flip_rate(w2r, r2w, n, delta)
    variance = n * (2.0 * q + delta * (1.0 - delta))
    excess = w2r - r2w - n * delta
    shrunk = np.sign(excess) * np.maximum(np.abs(excess) - continuity, 0.0)
    safe = np.where(variance > 0.0, variance, 1.0)
    return np.where(variance > 0.0, shrunk / np.sqrt(safe), np.where(shrunk == 0.0, 0.0, np.copysign(np.inf, shrunk)))


def paired_proportion_interval(wrong_to_right: Any, right_to_wrong: Any, n: Any, alpha: float = DEFAULT.alpha,
                               continuity: float = TANGO_CONTINUITY) -> tuple[np.ndarray, np.ndarray]:
    """(1 - alpha) interval of accuracy(dep) - accuracy(ref) from paired pass/fail counts (vectorised).

    Tango's asymptotic score interval (Statistics in Medicine 17:891-908, 1998), the unconditional interval
    Fagerland, Lydersen and Laake (Statistics in Medicine 33:2850-2875, 2014) recommend for paired proportions:
    the set of differences that Tango's score test does not reject, found by bisection on each side. Unlike
    McNemar's conditional interval it carries the sampling error of the number of discordant pairs: with no
    discordant pair at 40 items it is [-0.088, 0.088] (without the continuity adjustment), not [0, 0].
    Checked against the worked example of Fagerland et al. (their Table: complete response before and after
    consolidation therapy, Cavo et al. 2012; 6 and 16 discordant pairs of 161): -0.0621 (-0.1240 to -0.0054),
    reproduced with continuity=0 in tests/test_stats.py.
    """
    w2r = np.asarray(wrong_to_right, dtype=float)
    r2w = np.asarray(right_to_wrong, dtype=float)
    size = np.broadcast_to(np.asarray(n, dtype=float), np.broadcast_shapes(w2r.shape, r2w.shape))
    w2r, r2w = np.broadcast_to(w2r, size.shape), np.broadcast_to(r2w, size.shape)
    z = z_value(alpha)
    estimate = (w2r - r2w) / size
    # The statistic falls as delta grows: the lower end is where it drops to z, the upper where it drops to -z.
    low_out, low_in = np.full(size.shape, -1.0), estimate.copy()
    high_in, high_out = estimate.copy(), np.full(size.shape, 1.0)
    for _ in range(_BISECTIONS):
        mid = (low_out + low_in) / 2.0
        inside = _tango_statistic(w2r, r2w, size, mid, continuity) <= z
        low_in, low_out = np.where(inside, mid, low_in), np.where(inside, low_out, mid)
        mid = (high_in + high_out) / 2.0
        inside = _tango_statistic(w2r, r2w, size, mid, continuity) >= -z
        high_in, high_out = np.where(inside, mid, high_in), np.where(inside, high_out, mid)
    return low_in, high_in


def tango_interval(flips: Flips, alpha: float = DEFAULT.alpha,
                   continuity: float = TANGO_CONTINUITY) -> tuple[float | None, float | None]:
    """The paired interval of one comparison (None without items); see `paired_proportion_interval`."""
    if flips.n == 0:
        return None, None
    low, high = paired_proportion_interval(flips.wrong_to_right, flips.right_to_wrong, flips.n, alpha, continuity)
    return float(low), float(high)


def pass_fail_items_needed(wrong_to_right: int, right_to_wrong: int, n: int, margin: float,
                           alpha: float = DEFAULT.alpha, power: float = 0.8, limit: int = 10_000_000) -> int | None:
    """Paired items that show non-inferiority (lower bound of the interval above `margin`) with `power`, if the
    observed flip rates are the truth; None when the observed difference is not better than the margin.

    Start: the sample size of Tango's score test (Nam, Biometrics 53:1422-1430, 1997, for matched pairs):
    n = (z_{alpha/2} s0 + z_{power} s1)^2 / (delta - margin)^2, s0 and s1 the per-item standard deviations of the
    paired difference under the margin and under the observed rates. Then the exact power of the interval
    actually used (its continuity adjustment included) is computed over every (wrong->right, right->wrong)
    outcome, and n is raised until it reaches `power`: a rescaled half-width is no sample size.
    """
    if n <= 0:
        return None
    p_w2r, p_r2w = wrong_to_right / n, right_to_wrong / n
    delta = p_w2r - p_r2w
    if delta <= margin:
        return None
    q0 = float(_tango_restricted_flip_rate(p_w2r, p_r2w, 1.0, margin))
    s0 = math.sqrt(max(2.0 * q0 + margin * (1.0 - margin), 0.0))
    s1 = math.sqrt(max(p_w2r + p_r2w - delta * delta, 0.0))
    z_a, z_b = z_value(alpha), _normal_quantile(power)
    guess = max(2, math.ceil(((z_a * s0 + z_b * s1) / (delta - margin)) ** 2))
    size = guess
    while size <= limit:
        if _pass_fail_power(p_w2r, p_r2w, size, margin, alpha) >= power:
            break
        size = max(size + 1, math.ceil(size * 1.05))
    else:
        return None
    # Step back while a smaller size still has the power (the start may overshoot; power is not monotone in n
    # for discrete data, so the smallest size found this way is reported, not searched exhaustively).
    while size > 2 and _pass_fail_power(p_w2r, p_r2w, math.floor(size * 0.98), margin, alpha) >= power:
        size = math.floor(size * 0.98)
    return size


def _normal_quantile(p: float) -> float:
    return Z_POWER_80 if p == 0.8 else normal_quantile(p)


def _pass_fail_power(p_w2r: float, p_r2w: float, n: int, margin: float, alpha: float) -> float:
    """P(lower end of the paired interval > margin) over every outcome of n items with these flip rates."""
    from scipy.special import gammaln  # special functions only: cheap beside scipy.stats

    def span(p: float) -> np.ndarray:  # counts holding all but ~1e-12 of the probability
        sd = math.sqrt(n * p * (1 - p))
        return np.arange(max(0, math.floor(n * p - 8 * sd - 8)), min(n, math.ceil(n * p + 8 * sd + 8)) + 1)

    w, r = np.meshgrid(span(p_w2r), span(p_r2w), indexing="ij")
    w, r = w.ravel(), r.ravel()
    keep = w + r <= n
    w, r = w[keep], r[keep]
    rest = 1.0 - p_w2r - p_r2w
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = (gammaln(n + 1) - gammaln(w + 1) - gammaln(r + 1) - gammaln(n - w - r + 1)
                 + np.where(w > 0, w * np.log(p_w2r) if p_w2r > 0 else -np.inf, 0.0)
                 + np.where(r > 0, r * np.log(p_r2w) if p_r2w > 0 else -np.inf, 0.0)
                 + np.where(n - w - r > 0, (n - w - r) * np.log(rest) if rest > 0 else -np.inf, 0.0))
    low, _ = paired_proportion_interval(w, r, n, alpha)
    return float(np.sum(np.exp(log_p) * (low > margin)))


@dataclass(frozen=True)
class PassFail:
    """A pass/fail paired comparison: accuracies, their difference with Tango's interval, flips."""

    value: float  # deployment's share correct
    reference_value: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    flips: Flips
    alpha: float

    @property
    def n(self) -> int:
        return self.flips.n

    @property
    def p_value(self) -> float:
        return self.flips.p_value

    @property
    def significant(self) -> bool:
        """McNemar's exact test at alpha: the conventional test of "the two differ" on paired pass/fail items."""
        return self.flips.p_value < self.alpha

    @property
    def method(self) -> str:
        f = self.flips
        return (f"CI: Tango score interval, continuity {TANGO_CONTINUITY:g} ({f.right_to_wrong} right->wrong, "
                f"{f.wrong_to_right} wrong->right of {f.n}); p: McNemar exact")

    def items_needed(self, margin: float, power: float = 0.8) -> int | None:
        """Items that would show non-inferiority at `margin` with `power` if the observed flip rates hold."""
        f = self.flips
        return pass_fail_items_needed(f.wrong_to_right, f.right_to_wrong, f.n, margin, self.alpha, power)

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
    lo, hi = tango_interval(flips, s.alpha)
    value = sum(dep) / n if n else math.nan
    ref_value = sum(ref) / n if n else math.nan
    return PassFail(value, ref_value, value - ref_value, lo, hi, flips, s.alpha)


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
    """Percentile (1 - alpha) interval of a corpus score over resampled items; None below MIN_ITEMS_FOR_CORPUS_INTERVAL."""
    s = settings or DEFAULT
    st = np.asarray(item_stats, dtype=float)
    if len(st) < MIN_ITEMS_FOR_CORPUS_INTERVAL:
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
    if n < MIN_ITEMS_FOR_CORPUS_INTERVAL:
        return CorpusDiff(ref_value, value, diff, None, None, None, n,
                          f"{TOO_FEW_ITEMS} ({n} < {MIN_ITEMS_FOR_CORPUS_INTERVAL} paired items)")
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
    if len(sm) < MIN_ITEMS_FOR_INTERVAL:
        return ClusteredMean(mean, math.nan, math.nan, f"{TOO_FEW_ITEMS} ({len(sm)} < {MIN_ITEMS_FOR_INTERVAL} items)")
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
