"""Perplexity and distribution drift (KL-divergence) from per-token records: pure numpy, no model.

Statistics mirror llama.cpp's `llama-perplexity` (tools/perplexity/perplexity.cpp), so numbers can be
set beside its output:

- PPL = exp(mean NLL); its ± is the standard error of the mean NLL over tokens, carried to PPL by the
  delta method (d exp(x) = exp(x) dx). Tokens are treated as independent draws, as llama.cpp does;
  neighbouring tokens are correlated, so this understates the uncertainty somewhat.
- ln(PPL(Q)/PPL(base)) and PPL(Q) - PPL(base) use the covariance of the paired per-token NLLs.
- KLD is KL(P_ref || P_dep) per token (reference first, like llama.cpp's base model); mean ± SE over
  tokens, percentiles with linear interpolation (numpy's default = llama.cpp's `percentile`).
- Δp = p_dep(correct token) - p_ref(correct token); RMS ± from the SE of Δp² (delta method).
- Same top: both argmaxes equal. llama.cpp's ± is the Wald SE; the CI here is Wilson (scipy) because
  agreement sits near 100% where Wald collapses to zero width.

Across hosts (tests/host_tolerance.py): every sum and mean reported here is `math.fsum`'s correctly rounded sum
(`fsum_mean`), then IEEE-exact elementwise steps, so from the same records it is the same number on every host
whatever numpy's SIMD path (numpy's own reductions are fixed-order today, but that is its implementation, not a
promise). numpy's float64 exp/log are not: with AVX-512 numpy has its own vector exp/log, on AVX2 it calls libm,
and they differ in the last bit; figures that pass through them (KLD, Δp, the top-k bound) are equal across hosts
only within a stated tolerance.

KLD is exact where both sides give full distributions (`evalkit.metrics.kld`: the reference's stored once,
each deployment's computed against it token by token); otherwise the top-k approximation with one tail
bucket (see `kld_topk_tail`), a lower bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evalkit.metrics.stats import Z_95, wilson_ci

LN2 = math.log(2.0)
TopK = Sequence[Sequence[float]]  # [[token id, logprob], ...] for one position


def fsum(values: Sequence[float] | np.ndarray) -> float:
    """The correctly rounded sum (math.fsum): one number whatever the order, the SIMD width or numpy's version."""
    return math.fsum(np.asarray(values, dtype=np.float64).ravel().tolist())


def fsum_mean(values: Sequence[float] | np.ndarray) -> float:
    """Mean as the correctly rounded sum divided by n (NaN when empty): the same bits on every host."""
    x = np.asarray(values, dtype=np.float64)
    return fsum(x) / x.size if x.size else math.nan


def mean_se(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean and its standard error, as llama.cpp's `mean_and_uncertainty`: sqrt((E[x²] - E[x]²)/(n - 1)).

    (That is the sample standard deviation over sqrt(n).) llama.cpp reports 0 below 11 values; here the
    SE is NaN below 2 values and 0 only when the values really are all equal. Both from correctly rounded
    sums (two passes: the mean, then the squared deviations from it), so host-independent.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        return math.nan, math.nan
    mean = fsum_mean(x)
    if n < 2:
        return mean, math.nan
    return mean, sample_sd(x, mean) / math.sqrt(n)


def sample_sd(x: np.ndarray, mean: float) -> float:
    """Sample standard deviation (n - 1) about `mean` from the correctly rounded sum of squared deviations."""
    d = np.asarray(x, dtype=np.float64) - mean
    return math.sqrt(fsum(d * d) / (d.size - 1))


def _covariance_of_means(a: np.ndarray, b: np.ndarray) -> float:
    """Cov(mean a, mean b) for paired values, as llama.cpp's `covariance` (population cov / (n - 1))."""
    n = a.size
    if n < 2:
        return math.nan
    return (fsum_mean(a * b) - fsum_mean(a) * fsum_mean(b)) / (n - 1)


@dataclass(frozen=True)
class PplStats:
    """Perplexity of one deployment over its scored tokens."""

    n_tokens: int
    n_bytes: int
    nll_mean: float
    nll_se: float
    ppl: float
    ppl_se: float  # delta method: ppl * nll_se
    bits_per_byte: float  # total NLL in bits / bytes of the scored text
    bpb_se: float

    def ci(self, value: float, se: float) -> tuple[float, float]:
        return value - Z_95 * se, value + Z_95 * se


def perplexity_stats(nll: Sequence[float] | np.ndarray, n_bytes: int) -> PplStats:
    """PPL, mean NLL and bits per byte of natural-log NLLs over `n_bytes` bytes of scored text."""
    x = np.asarray(nll, dtype=np.float64)
    mean, se = mean_se(x)
    ppl = math.exp(mean) if x.size else math.nan
    total_bits = fsum(x) / LN2
    bpb = total_bits / n_bytes if n_bytes > 0 else math.nan
    # bits/byte = mean NLL * n / (ln 2 * bytes): a fixed multiple of the mean, so its SE scales alike.
    bpb_se = se * x.size / (LN2 * n_bytes) if n_bytes > 0 else math.nan
    return PplStats(int(x.size), int(n_bytes), mean, se, ppl, ppl * se, bpb, bpb_se)


@dataclass(frozen=True)
class PairedPpl:
    """llama.cpp's "Perplexity statistics" block for a deployment (Q) against a reference (base)."""

    n_tokens: int
    ln_ratio: float  # mean ln(PPL(Q)/PPL(base)) = mean NLL_Q - mean NLL_base
    ln_ratio_se: float
    ratio: float  # PPL(Q)/PPL(base)
    ratio_se: float
    diff: float  # PPL(Q) - PPL(base)
    diff_se: float
    correlation: float  # Cor(ln PPL(Q), ln PPL(base))


def paired_perplexity(nll_dep: Sequence[float] | np.ndarray, nll_ref: Sequence[float] | np.ndarray) -> PairedPpl:
    """Paired PPL comparison on the same tokens, with llama.cpp's covariance-aware uncertainties."""
    q = np.asarray(nll_dep, dtype=np.float64)
    b = np.asarray(nll_ref, dtype=np.float64)
    if q.shape != b.shape or q.ndim != 1:
        raise ValueError(f"paired NLLs must be 1-D and the same length (got {q.shape} and {b.shape})")
    mq, sq = mean_se(q)
    mb, sb = mean_se(b)
    cov = _covariance_of_means(q, b)
    ln_ratio = mq - mb
    ln_ratio_se = math.sqrt(max(sq * sq + sb * sb - 2.0 * cov, 0.0)) if q.size >= 2 else math.nan
    ppl_q, ppl_b = math.exp(mq), math.exp(mb)
    ratio = math.exp(ln_ratio)
    diff_se = math.sqrt(max((ppl_q * sq) ** 2 + (ppl_b * sb) ** 2 - 2.0 * ppl_q * ppl_b * cov, 0.0)) if q.size >= 2 else math.nan
    cor = cov / (sq * sb) if sq > 0 and sb > 0 else math.nan
    return PairedPpl(int(q.size), ln_ratio, ln_ratio_se, ratio, ratio * ln_ratio_se, ppl_q - ppl_b, diff_se, cor)


# -- KL-divergence ---------------------------------------------------------------------------------


def kl_divergence(ref_logprobs: np.ndarray, dep_logprobs: np.ndarray) -> np.ndarray:
    """Exact KL(P_ref || P_dep) along the last axis from full log-probability rows (natural log).

    llama.cpp stores the base log-probs as uint16 and skips probabilities below e^-16; here every term
    counts, in float64.
    """
    p = np.exp(ref_logprobs.astype(np.float64))
    return np.sum(p * (ref_logprobs.astype(np.float64) - dep_logprobs.astype(np.float64)), axis=-1)


def kld_topk_tail(ref_lp: np.ndarray, dep_lp: np.ndarray) -> np.ndarray:
    """KL(P_ref || P_dep) over known token buckets plus one tail bucket, per row.

    `ref_lp`, `dep_lp`: (n, m) log-probabilities of the same m token ids under each model; NaN marks an id
    whose probability is unknown for either model (rows may be padded with NaN). Every id known for both
    models is its own bucket; everything else, including known ids the other model did not report, is
    lumped into a tail with mass 1 - Σ known for each model.

    Bias: this is KL between coarse-grained versions of the two distributions, and coarse-graining never
    increases KL (log-sum inequality), so the result is a lower bound on the exact KLD; it misses
    P_tail · KL(P_ref|tail || P_dep|tail), the divergence *inside* the tail. It is exact when the tail
    carries no reference mass. Rounding of the stored log-probs (1e-6) can make a tail slightly negative;
    tails are clipped to [0, 1], and a zero dep tail facing a positive ref tail is floored at 1e-12.
    """
    ref_lp = np.atleast_2d(np.asarray(ref_lp, dtype=np.float64))
    dep_lp = np.atleast_2d(np.asarray(dep_lp, dtype=np.float64))
    known = np.isfinite(ref_lp) & np.isfinite(dep_lp)
    p = np.where(known, np.exp(np.where(known, ref_lp, 0.0)), 0.0)
    q = np.where(known, np.exp(np.where(known, dep_lp, 0.0)), 0.0)
    terms = np.where(known & (p > 0), p * (np.where(known, ref_lp, 0.0) - np.where(known, dep_lp, 0.0)), 0.0)
    p_tail = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_tail = np.clip(1.0 - q.sum(axis=1), 0.0, 1.0)
    q_tail = np.where((p_tail > 0) & (q_tail <= 0), 1e-12, q_tail)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_tail > 0, p_tail * (np.log(p_tail) - np.log(q_tail)), 0.0)
    return terms.sum(axis=1) + tail


@dataclass(frozen=True)
class TokenDrift:
    """Per-token drift of a deployment from the reference, on identical token sequences."""

    kld: np.ndarray  # KL(P_ref || P_dep): exact, or the top-k + tail lower bound
    same_top: np.ndarray  # bool: argmax(P_dep) == argmax(P_ref)
    delta_p: np.ndarray  # p_dep(correct) - p_ref(correct)


def token_drift(
    targets: Sequence[int],
    ref_nll: Sequence[float],
    dep_nll: Sequence[float],
    ref_top: Sequence[TopK],
    dep_top: Sequence[TopK],
) -> TokenDrift:
    """KLD, top-1 agreement and Δp per scored token from stored top-k lists and target NLLs.

    The bucket set per token is the reference's top-k ids plus the correct (target) token, whose
    log-probability both records hold exactly. The deployment's log-prob of a reference id is read from
    the deployment's own top-k; an id missing there goes to the tail (see `kld_topk_tail`).
    """
    n = len(targets)
    if not (len(ref_nll) == len(dep_nll) == len(ref_top) == len(dep_top) == n):
        raise ValueError("targets, NLLs and top-k lists must have one entry per scored token")
    width = max((len(t) for t in ref_top), default=0) + 1
    ref_lp = np.full((n, width), np.nan)
    dep_lp = np.full((n, width), np.nan)
    same_top = np.zeros(n, dtype=bool)
    for i in range(n):
        target = int(targets[i])
        ref_map = {int(t): float(lp) for t, lp in ref_top[i]}
        dep_map = {int(t): float(lp) for t, lp in dep_top[i]}
        # The target's log-probs are exact in both records: the top-k copies must not override them.
        ref_map[target] = -float(ref_nll[i])
        dep_map[target] = -float(dep_nll[i])
        for j, (tok, lp) in enumerate(ref_map.items()):
            ref_lp[i, j] = lp
            dep_lp[i, j] = dep_map.get(tok, np.nan)
        if ref_top[i] and dep_top[i]:
            same_top[i] = _argmax(ref_top[i]) == _argmax(dep_top[i])
    delta_p = np.exp(-np.asarray(dep_nll, dtype=np.float64)) - np.exp(-np.asarray(ref_nll, dtype=np.float64))
    return TokenDrift(kld_topk_tail(ref_lp, dep_lp) if n else np.zeros(0), same_top, delta_p)


def token_drift_arrays(
    targets: np.ndarray,
    ref_nll: np.ndarray,
    dep_nll: np.ndarray,
    ref_ids: np.ndarray,
    ref_lp: np.ndarray,
    dep_ids: np.ndarray,
    dep_lp: np.ndarray,
) -> TokenDrift:
    """`token_drift` on arrays (n, k) of top-k ids and log-probs (an entry with a non-finite log-prob is
    padding), vectorised: the same buckets in the same column order (the reference's top-k as listed, the
    target's column last when it is not among them), so the sums are the same numbers as `token_drift`'s.

    The deployment's log-prob of each reference id is found by one sorted search over (row, id) keys
    instead of a dictionary per token."""
    ref_ids = np.asarray(ref_ids, dtype=np.int64)
    dep_ids = np.asarray(dep_ids, dtype=np.int64)
    r_lp = np.asarray(ref_lp, dtype=np.float64)
    d_lp = np.asarray(dep_lp, dtype=np.float64)
    tg = np.asarray(targets, dtype=np.int64)
    rn = np.asarray(ref_nll, dtype=np.float64)
    dn = np.asarray(dep_nll, dtype=np.float64)
    n, k = ref_ids.shape
    if not (tg.size == rn.size == dn.size == n == dep_ids.shape[0]):
        raise ValueError("targets, NLLs and top-k arrays must have one entry per scored token")
    r_valid = np.isfinite(r_lp)
    d_valid = np.isfinite(d_lp)
    ref_full = np.full((n, k + 1), np.nan)
    dep_full = np.full((n, k + 1), np.nan)
    ref_full[:, :k] = np.where(r_valid, r_lp, np.nan)
    # The deployment's value at each reference id: its top-k scattered into a dense (rows, vocabulary) block,
    # read back at the reference's ids (a block of rows at a time keeps the scratch small).
    span = int(max(ref_ids.max(initial=0), dep_ids.max(initial=0), tg.max(initial=0))) + 1
    looked = np.full((n, k), np.nan)
    block = max(1, min(n, (1 << 22) // max(span, 1)))  # ~32 MB of float64 scratch at most
    dense = np.full((block, span), np.nan)
    for b0 in range(0, n, block):
        rows = slice(b0, min(n, b0 + block))
        m = rows.stop - rows.start
        r_idx = np.broadcast_to(np.arange(m)[:, None], dep_ids[rows].shape)
        dv = d_valid[rows]
        dense[r_idx[dv], dep_ids[rows][dv]] = d_lp[rows][dv]
        looked[rows] = dense[np.broadcast_to(np.arange(m)[:, None], ref_ids[rows].shape), ref_ids[rows]]
        dense[r_idx[dv], dep_ids[rows][dv]] = np.nan  # reset only what was written
    dep_full[:, :k] = np.where(r_valid, looked, np.nan)
    # The target's log-probs are exact in both records (its NLL): they override the top-k copies.
    at_target = r_valid & (ref_ids == tg[:, None])
    in_top = at_target.any(axis=1)
    ref_full[:, :k] = np.where(at_target, -rn[:, None], ref_full[:, :k])
    dep_full[:, :k] = np.where(at_target, -dn[:, None], dep_full[:, :k])
    ref_full[:, k] = np.where(in_top, np.nan, -rn)
    dep_full[:, k] = np.where(in_top, np.nan, -dn)
    # Argmax of each side's top-k as listed (ties: the first listed), where both sides have any.
    r_any, d_any = r_valid.any(axis=1), d_valid.any(axis=1)
    r_top = ref_ids[np.arange(n), np.argmax(np.where(r_valid, r_lp, -np.inf), axis=1)] if k else np.zeros(n, np.int64)
    d_top = dep_ids[np.arange(n), np.argmax(np.where(d_valid, d_lp, -np.inf), axis=1)] if dep_ids.shape[1] else np.zeros(n, np.int64)
    same_top = r_any & d_any & (r_top == d_top)
    delta_p = np.exp(-dn) - np.exp(-rn)
    return TokenDrift(kld_topk_tail(ref_full, dep_full) if n else np.zeros(0), same_top, delta_p)


def _argmax(top: TopK) -> int:
    best = max(range(len(top)), key=lambda j: (float(top[j][1]), -j))  # ties: the first listed wins
    return int(top[best][0])


# llama.cpp's percentile rows (tools/perplexity/perplexity.cpp, `kl_divergence`), as (metric suffix, fraction).
KLD_PERCENTILES = (("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("median", 0.5),
                   ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0_1", 0.001))
DELTA_P_PERCENTILES = (("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.90), ("p75", 0.75),
                       ("median", 0.5), ("p25", 0.25), ("p10", 0.10), ("p5", 0.05), ("p1", 0.01), ("p0_1", 0.001))


@dataclass(frozen=True)
class DriftSummary:
    """llama.cpp's "KL divergence" and "Token probability" statistics blocks."""

    n_tokens: int
    exact: bool  # full-vocabulary KLD (else the top-k + tail lower bound)
    kld_mean: float
    kld_se: float
    kld_max: float
    kld_min: float
    kld_percentiles: dict[str, float]  # KLD_PERCENTILES suffix -> value
    same_top: float
    same_top_se: float  # llama.cpp's ± (binomial SE, n - 1)
    same_top_ci: tuple[float, float]  # Wilson 95%
    delta_p_mean: float
    delta_p_se: float
    delta_p_rms: float
    delta_p_rms_se: float
    delta_p_max: float
    delta_p_min: float
    delta_p_percentiles: dict[str, float]


def _percentiles(x: np.ndarray, table: tuple[tuple[str, float], ...]) -> dict[str, float]:
    """llama.cpp's `percentile`: linear interpolation at fraction * (n - 1) (numpy's default method); its
    median is the mean of the two middle values, which is the same number."""
    return {name: float(np.quantile(x, frac)) for name, frac in table}


def summarize_drift(drift: TokenDrift, exact: bool = False) -> DriftSummary:
    k = np.asarray(drift.kld, dtype=np.float64)
    n = int(k.size)
    if n == 0:
        nan = math.nan
        return DriftSummary(0, exact, nan, nan, nan, nan, {s: nan for s, _ in KLD_PERCENTILES}, nan, nan, (nan, nan),
                            nan, nan, nan, nan, nan, nan, {s: nan for s, _ in DELTA_P_PERCENTILES})
    kmean, kse = mean_se(k)
    dp = np.asarray(drift.delta_p, dtype=np.float64)
    dmean, dse = mean_se(dp)
    mse, mse_se = mean_se(dp * dp)
    rms = math.sqrt(mse)
    rms_se = 0.5 / rms * mse_se if rms > 0 else 0.0  # d sqrt(x) = dx / (2 sqrt x), as llama.cpp
    agree = int(np.sum(drift.same_top))
    top = agree / n
    return DriftSummary(
        n_tokens=n,
        exact=exact,
        kld_mean=kmean,
        kld_se=kse,
        kld_max=float(k.max()),
        kld_min=float(k.min()),
        kld_percentiles=_percentiles(k, KLD_PERCENTILES),
        same_top=top,
        same_top_se=math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else math.nan,
        same_top_ci=wilson_ci(agree, n),
        delta_p_mean=dmean,
        delta_p_se=dse,
        delta_p_rms=rms,
        delta_p_rms_se=rms_se,
        delta_p_max=float(dp.max()),
        delta_p_min=float(dp.min()),
        delta_p_percentiles=_percentiles(dp, DELTA_P_PERCENTILES),
    )


# -- from raw logits (engine side, but pure numpy) -------------------------------------------------


def nll_and_topk(
    logits: np.ndarray, targets: Sequence[int], k: int, block: int = 4, lanes: int = 16, normalized: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of raw logits (n, vocab): NLL of `targets[i]`, and the top-k ids and log-probs (descending).

    Written for 262k-wide vocabularies without a full log-softmax matrix (np.argpartition over whole
    rows is ~3x slower than all of this). Per block of rows (small, to stay in cache):
    - the row is viewed as `lanes` slices of width W; the elementwise max across slices gives W "bucket"
      maxima (bucket j = ids j, j+W, j+2W, ...), and the row max for free;
    - logsumexp from one subtract / exp / sum pass (what llama-perplexity computes per row);
    - the top-k ids lie in the k buckets with the largest maxima (any id outside them has k larger
      bucket maxima above it), so only k * lanes candidates (+ the vocab % lanes leftovers) are sorted.
    `logits` is not modified. `normalized`: the rows already are log-softmax (their logsumexp is 0, skip it).
    """
    x_all = np.asarray(logits)
    n, vocab = x_all.shape
    k = min(k, vocab)
    tg = np.asarray(targets, dtype=np.int64)
    nll = np.empty(n, dtype=np.float64)
    ids = np.empty((n, k), dtype=np.int64)
    lps = np.empty((n, k), dtype=np.float64)
    if vocab // lanes < max(k, 1):
        lanes = 1  # tiny vocabularies: one lane, the buckets are the ids themselves
    width = vocab // lanes
    offsets = np.arange(lanes, dtype=np.int64)[None, None, :] * width
    leftovers = np.arange(width * lanes, vocab, dtype=np.int64)
    scratch = np.empty((min(block, n), vocab) if not normalized else (0, 0), dtype=np.float32)
    for b0 in range(0, n, block):
        x = x_all[b0 : b0 + block]
        rows = x.shape[0]
        bucket_max = x[:, : width * lanes].reshape(rows, lanes, width).max(axis=1)
        m = bucket_max.max(axis=1, keepdims=True)
        if leftovers.size:
            m = np.maximum(m, x[:, leftovers].max(axis=1, keepdims=True))
        if normalized:
            lse = np.zeros(rows)
        else:
            s = scratch[:rows]
            np.subtract(x, m, out=s)
            np.exp(s, out=s)
            lse = m[:, 0].astype(np.float64) + np.log(s.sum(axis=1).astype(np.float64))
        nll[b0 : b0 + rows] = lse - x[np.arange(rows), tg[b0 : b0 + rows]]
        if k == 0:
            continue
        if k * lanes * 8 > vocab:  # large k (the KLD bound's top-2000): the buckets stop paying, partition rows
            cand = np.argpartition(x, -k, axis=1)[:, -k:]
        else:
            best = np.argpartition(bucket_max, -k, axis=1)[:, -k:]
            cand = (best[:, :, None] + offsets).reshape(rows, -1)
            if leftovers.size:
                cand = np.concatenate([cand, np.broadcast_to(leftovers, (rows, leftovers.size))], axis=1)
        vals = np.take_along_axis(x, cand, axis=1)
        order = np.lexsort((cand, -vals), axis=1)[:, :k]  # logit descending, then id: deterministic ties
        ids[b0 : b0 + rows] = np.take_along_axis(cand, order, axis=1)
        lps[b0 : b0 + rows] = np.take_along_axis(vals, order, axis=1).astype(np.float64) - lse[:, None]
    return nll, ids, lps
