"""Scoring from records only: each deployment's chunks, their pairing with the reference's, and the score and
comparison rows (llama-perplexity's statistics)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evalkit.metrics.kld import tokens_sha256
from evalkit.metrics.likelihood import (
    DriftSummary,
    PplStats,
    TokenDrift,
    fsum,
    fsum_mean,
    paired_perplexity,
    perplexity_stats,
    sample_sd,
    summarize_drift,
    token_drift_arrays,
)
from evalkit.metrics.stats import BlockMean, block_clustered_mean, excludes_zero, normal_two_sided_p, z_value
from evalkit.records import typed
from evalkit.suites.perplexity.records import PerplexityRecord, token_arrays
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.suites.base import ScoreContext
from evalkit.suites.perplexity.chunking import CATEGORY


@dataclass
class Chunks:
    """One deployment's scored chunks: the (small) records by item id and each chunk's NLL (float64). The
    per-token arrays stay in the side files; pairing reads them one chunk at a time."""

    records: dict[str, PerplexityRecord]
    nll: dict[str, np.ndarray]
    run_dir: Path | None
    where: str

    @classmethod
    def of(cls, records: list[Any], run_dir: Path | None, dep: str) -> "Chunks":
        parsed = typed({"": records})[""]
        recs = {r.item_id: r for r in parsed if isinstance(r, PerplexityRecord) and r.scored}
        where = f"records/{dep}.jsonl"
        chunks = cls(dict(sorted(recs.items())), {}, run_dir, where)
        chunks.nll = {cid: np.asarray(chunks.arrays(cid)["nll"], dtype=np.float64) for cid in chunks.records}
        return chunks

    @property
    def ids(self) -> list[str]:
        return list(self.records)

    def arrays(self, cid: str) -> np.ndarray:
        return token_arrays(self.records[cid], self.run_dir, self.where)

    def tokens_key(self, cid: str) -> tuple[str, int | None]:
        """What must be equal for two deployments' chunks to pair: the chunk's token ids and scored_from."""
        r = self.records[cid]
        return (r.tokens_sha256 or tokens_sha256(r.token_ids or []), r.scored_from)

    def ppl(self, ids: list[str] | None = None) -> PplStats:
        ids = self.ids if ids is None else ids
        nll = np.concatenate([self.nll[c] for c in ids]) if ids else np.zeros(0)
        return perplexity_stats(nll, sum(int(self.records[c].n_bytes or 0) for c in ids))

    def __bool__(self) -> bool:
        return bool(self.records)


def ordered(chunks: dict[str, Any], ctx: ScoreContext) -> list[str]:
    known = [d for d in ctx.deployments if d in chunks and chunks[d]]
    return known + sorted(d for d in chunks if d not in known and chunks[d])


def ppl_rows(dep: str, suite: str, st: PplStats, alpha: float) -> list[ScoreRow]:
    z = z_value(alpha)

    def row(metric: str, value: float, se: float | None) -> ScoreRow:
        lo, hi = (value - z * se, value + z * se) if se is not None and math.isfinite(se) else (None, None)
        return ScoreRow(dep, suite, CATEGORY, metric, value, lo, hi, st.n_tokens)

    return [
        row("ppl", st.ppl, st.ppl_se),
        row("nll_mean", st.nll_mean, st.nll_se),
        row("bits_per_byte", st.bits_per_byte, st.bpb_se),
        row("n_tokens", float(st.n_tokens), None),
        row("n_bytes", float(st.n_bytes), None),
    ]


def drift_rows(dep: str, suite: str, d: DriftSummary, extra: list[tuple[str, float, float | None]],
                alpha: float) -> list[ScoreRow]:
    n = d.n_tokens
    z = z_value(alpha)

    def ci(v: float, se: float) -> tuple[float | None, float | None]:
        return (v - z * se, v + z * se) if math.isfinite(se) else (None, None)

    rows = [ScoreRow(dep, suite, CATEGORY, "kld_mean", d.kld_mean, *ci(d.kld_mean, d.kld_se), n)]
    # llama.cpp's whole statistics block: KLD max / percentiles / min, Δp mean / RMS / max / percentiles / min.
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_max", d.kld_max, None, None, n))
    rows += [ScoreRow(dep, suite, CATEGORY, f"kld_{name}", v, None, None, n) for name, v in d.kld_percentiles.items()]
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_min", d.kld_min, None, None, n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "kld_exact", float(d.exact), None, None, n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "top1_agreement", d.same_top, d.same_top_ci[0], d.same_top_ci[1], n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_mean", d.delta_p_mean, *ci(d.delta_p_mean, d.delta_p_se), n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_rms", d.delta_p_rms, *ci(d.delta_p_rms, d.delta_p_rms_se), n))
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_max", d.delta_p_max, None, None, n))
    rows += [ScoreRow(dep, suite, CATEGORY, f"delta_p_{name}", v, None, None, n) for name, v in d.delta_p_percentiles.items()]
    rows.append(ScoreRow(dep, suite, CATEGORY, "delta_p_min", d.delta_p_min, None, None, n))
    for metric, value, se in extra:
        rows.append(ScoreRow(dep, suite, CATEGORY, metric, value, *(ci(value, se) if se is not None else (None, None)), n))
    return rows


@dataclass
class Pair:
    """A deployment's chunks lined up with the reference's: paired when the token ids are identical."""

    ref: "Chunks"
    dep: "Chunks"
    ref_ids: list[str]  # the chunks used on each side (the shared ones when paired)
    dep_ids: list[str]
    reason: str | None  # why KLD / paired PPL is not computed, or None
    per_chunk: dict[str, Any]  # item_id -> TokenDrift
    drift: DriftSummary | None
    top_k: int
    # Exact pairs: how far the top-k + tail bound at this k reads below the exact mean KLD (1 - bound/exact).
    bound_bias: float | None = None

    @property
    def n_tokens(self) -> int:
        return sum(int(self.dep.nll[c].size) for c in self.dep_ids)

    def nll(self) -> tuple[np.ndarray, np.ndarray]:
        def cat(c: Chunks, ids: list[str]) -> np.ndarray:
            return np.concatenate([c.nll[i] for i in ids]) if ids else np.zeros(0)

        return cat(self.dep, self.dep_ids), cat(self.ref, self.ref_ids)

    def ratio_rows(self) -> list[tuple[str, float, float | None]]:
        """llama.cpp's "Perplexity statistics" block beside the deployment's own PPL."""
        p = paired_perplexity(*self.nll())
        return [
            ("ppl_ratio", p.ratio, p.ratio_se), ("ln_ppl_ratio", p.ln_ratio, p.ln_ratio_se),
            ("ppl_diff", p.diff, p.diff_se), ("nll_correlation", p.correlation, None),
        ]

    def bias_rows(self) -> list[tuple[str, float, float | None]]:
        return [("kld_bound_bias", self.bound_bias, None)] if self.bound_bias is not None else []

    def comparison_rows(self, dep: str, ref: str, suite: str, alpha: float) -> list[ComparisonRow]:
        # Significance, as everywhere: the (1 - alpha) interval of the difference excludes 0.
        z = z_value(alpha)
        if self.reason is not None:
            return self._unpaired_rows(dep, ref, suite, z)
        q, b = self.nll()
        n = int(q.size)
        p = paired_perplexity(q, b)
        if p.ln_ratio_se > 0:
            p_value = normal_two_sided_p(p.ln_ratio / p.ln_ratio_se)
        else:  # identical per-token NLL differences: no noise to test against
            p_value = 1.0 if p.ln_ratio == 0 else 0.0
        lo, hi = p.diff - z * p.diff_se, p.diff + z * p.diff_se
        ppl_q, ppl_b = math.exp(fsum_mean(q)), math.exp(fsum_mean(b))
        rows = [ComparisonRow(
            dep, ref, suite, CATEGORY, "ppl", ppl_q, ppl_b, p.diff, lo, hi, p_value, n,
            f"paired over {n} tokens: PPL(Q)-PPL(ref) ± z SE with the NLL covariance (llama-perplexity); "
            f"p: z-test of ln(PPL ratio)", excludes_zero(lo, hi),
        )]
        # What the decision reads for a perplexity-ratio margin: exp of the mean per-token NLL difference, with a
        # block-clustered interval (tokens of a passage move together; the token-level SE above does not see it).
        ln_ratio = block_clustered_mean([self.dep.nll[d] - self.ref.nll[r] for d, r in zip(self.dep_ids, self.ref_ids)], alpha)
        r_low = None if ln_ratio.ci_low is None else math.exp(ln_ratio.ci_low) - 1.0
        r_high = None if ln_ratio.ci_high is None else math.exp(ln_ratio.ci_high) - 1.0
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "ppl_ratio", math.exp(ln_ratio.mean), 1.0, math.exp(ln_ratio.mean) - 1.0,
            r_low, r_high, None, n, f"PPL(Q)/PPL(ref) = exp(mean per-token NLL difference); CI: {ln_ratio.method}",
            excludes_zero(r_low, r_high),
        ))
        n_bytes = sum(int(self.ref.records[c].n_bytes or 0) for c in self.ref_ids)
        d = q - b
        bpb_diff = fsum(d) / (math.log(2) * n_bytes)
        bpb_se = sample_sd(d, fsum_mean(d)) * math.sqrt(n) / (math.log(2) * n_bytes) if n > 1 else math.nan
        dep_bpb = self.dep.ppl(self.dep_ids).bits_per_byte
        ref_bpb = self.ref.ppl(self.ref_ids).bits_per_byte
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "bits_per_byte", dep_bpb, ref_bpb, bpb_diff,
            bpb_diff - z * bpb_se, bpb_diff + z * bpb_se, p_value, n,
            f"paired over {n} tokens: SE of per-token NLL differences; p as for ppl",
            excludes_zero(bpb_diff - z * bpb_se, bpb_diff + z * bpb_se),
        ))
        return rows + (self.drift_comparison_rows(dep, ref, suite, alpha) if self.drift is not None else [])

    def drift_comparison_rows(self, dep: str, ref: str, suite: str, alpha: float) -> list[ComparisonRow]:
        """KLD and top-1 agreement of `dep` against `ref` (whose distributions or top-k it was measured with), with
        block-clustered intervals (stats.block_clustered_mean): what the decision reads. llama.cpp's token-level
        SEs stay on the score rows, for the llama-perplexity parity block."""
        assert self.drift is not None
        k = self.drift
        drifts = [self.per_chunk[c] for c in self.dep_ids if c in self.per_chunk]
        kld = block_clustered_mean([d.kld for d in drifts], alpha)
        top = block_clustered_mean([np.asarray(d.same_top, dtype=np.float64) for d in drifts], alpha)
        how = "exact over the full vocabulary" if k.exact else f"top-{self.top_k}+tail approximation ({bound_looseness(self.top_k)})"
        top_low = None if top.ci_low is None else top.ci_low - 1.0
        top_high = None if top.ci_high is None else min(top.ci_high, 1.0) - 1.0
        return [
            ComparisonRow(dep, ref, suite, CATEGORY, "kld", k.kld_mean, 0.0, k.kld_mean, kld.ci_low, kld.ci_high, None,
                          k.n_tokens, f"mean KL(ref||dep), {how}; CI: {kld.method}",
                          excludes_zero(kld.ci_low, kld.ci_high)),
            ComparisonRow(dep, ref, suite, CATEGORY, "top1_agreement", k.same_top, 1.0, k.same_top - 1.0, top_low,
                          top_high, None, k.n_tokens, f"share of scored tokens where both argmaxes agree; CI: {top.method}",
                          top_high is not None and top_high < 0.0),
        ]

    def _unpaired_rows(self, dep: str, ref: str, suite: str, z: float) -> list[ComparisonRow]:
        nan = math.nan
        rows = [ComparisonRow(dep, ref, suite, CATEGORY, "kld", nan, 0.0, nan, None, None, None, 0,
                              f"not computed: {self.reason}", False)]
        if not self.ref_ids or not self.dep_ids:
            return rows
        a, b = self.dep.ppl(self.dep_ids), self.ref.ppl(self.ref_ids)
        diff = a.bits_per_byte - b.bits_per_byte
        se = math.hypot(a.bpb_se, b.bpb_se)  # independent samples: the texts were cut differently
        p_value = normal_two_sided_p(diff / se) if se > 0 else nan
        rows.append(ComparisonRow(
            dep, ref, suite, CATEGORY, "bits_per_byte", a.bits_per_byte, b.bits_per_byte, diff,
            diff - z * se, diff + z * se, p_value, a.n_tokens + b.n_tokens,
            f"unpaired ({self.reason}): ± z sqrt(SE_dep² + SE_ref²); PPL not compared across tokenizations",
            excludes_zero(diff - z * se, diff + z * se),
        ))
        return rows


DRIFT_METRICS = ("kld", "top1_agreement")

# How far the top-k + tail bound read below the exact mean KLD, by k (hf engine, fp8-weight vs bf16 Gemma 3 270M,
# WikiText-2, n_ctx 512: the KLD_BIAS measurement in suite.py); Q2_K-class drift loses more (~50% at k=20).
BOUND_READS_LOW = ((20, 0.31), (100, 0.17), (500, 0.077), (1000, 0.050), (2000, 0.029))


def bound_looseness(k: int) -> str:
    """The top-k + tail bound's looseness at `k`, in words, from the nearest measured k at or above it."""
    if k <= 0:
        return "no KLD: no top-k log-probs by token id"
    at = next(((kk, low) for kk, low in BOUND_READS_LOW if kk >= k), None)
    if at is None:
        return f"a lower bound; read {BOUND_READS_LOW[-1][1]:.1%} low at k={BOUND_READS_LOW[-1][0]}, less above"
    kk, low = at
    return f"a lower bound; read {low:.0%} low at k={kk} on Gemma 3 270M fp8 vs bf16" + (" (more at a smaller k)" if kk != k else "")


@dataclass
class Pairs:
    """One deployment's pairings: `ppl` with the run's reference (paired PPL, and the top-k bound), `kld` the
    one whose drift is reported (exact against `kld_reference`'s stored distributions where the records were
    measured so, else `ppl`)."""

    ppl: Pair | None
    kld: Pair | None
    kld_reference: str

    @property
    def exact(self) -> bool:
        return self.kld is not None and self.kld.drift is not None and self.kld.drift.exact


def pair_deployments(chunks: dict[str, "Chunks"], ctx: ScoreContext) -> dict[str, Pairs]:
    ref = ctx.reference
    out: dict[str, Pairs] = {}
    for dep in ordered(chunks, ctx):
        owners = {r.kld_reference for r in chunks[dep].records.values()}
        owner = owners.pop() if len(owners) == 1 else None
        exact = pair_chunks(chunks[owner], chunks[dep], owner) if owner is not None and owner not in (dep, ref) and chunks.get(owner) else None
        if exact is not None and not (exact.drift is not None and exact.drift.exact):
            exact = None
        # With exact KLD elsewhere, the pair with the reference serves paired PPL only: its top-k drift (the
        # slow part of scoring at a large top_k) is not computed.
        ppl = pair_chunks(chunks[ref], chunks[dep], ref, drift=exact is None) if dep != ref and chunks.get(ref) else None
        out[dep] = Pairs(ppl, exact, owner) if exact is not None and owner is not None else Pairs(ppl, ppl, ref)
    return out


def same_weights(manifest: dict[str, Any], a: str, b: str) -> bool:
    """True when the manifest fingerprinted the same model files for deployments `a` and `b`."""
    deps = manifest.get("deployments") or {}
    sha = [(deps.get(n) or {}).get("sha256") for n in (a, b)]
    return sha[0] is not None and sha[0] == sha[1]


def same_weights_rows(dep: str, bound: DriftSummary, exact: dict[str, Pairs], ctx: ScoreContext
                       ) -> list[tuple[str, float, float | None]]:
    """For a deployment with only the top-k bound (vLLM): the exact KLD another engine measured in this run
    on the same weights against a reference of the same weights, and how far the bound reads below it."""
    for other, p in exact.items():
        if other == dep or not (same_weights(ctx.manifest, dep, other) and same_weights(ctx.manifest, ctx.reference, p.kld_reference)):
            continue
        drift = p.kld.drift if p.kld is not None else None  # an exact pair always has its drift
        value = drift.kld_mean if drift is not None else 0.0
        if value > 0:
            return [("kld_same_weights_exact", value, None), ("kld_bound_reads_below", 1.0 - bound.kld_mean / value, None)]
    return []


def pair_chunks(ref_c: "Chunks", dep_c: "Chunks", reference: str, drift: bool = True) -> Pair:
    """Line up chunks present for both; KLD needs every shared chunk's token ids to be identical (`drift`
    False: paired PPL only, no KLD). Side files are read one chunk pair at a time."""
    shared = sorted(set(ref_c.records) & set(dep_c.records))
    top_k = min((int(r.top_k if r.top_k is not None else (len(r.top[0]) if r.top else 0))
                 for c in (ref_c, dep_c) for r in c.records.values()), default=0)
    reason = None
    if not shared:
        reason = "no chunks in common with the reference"
    elif any(ref_c.tokens_key(c) != dep_c.tokens_key(c) for c in shared):
        reason = "mismatched tokenization (chunk token ids differ from the reference's)"
    if reason is not None or not drift:
        ids = (ref_c.ids, dep_c.ids) if reason is not None else (shared, shared)
        return Pair(ref_c, dep_c, ids[0], ids[1], reason, {}, None, top_k)
    bound: dict[str, TokenDrift] = {}
    per_chunk: dict[str, TokenDrift] = {}
    exact = True
    for c in shared:
        ra, da = ref_c.arrays(c), dep_c.arrays(c)
        b = _bound_chunk(ra, da)
        if b is not None:
            bound[c] = b
        # Exact only when every shared chunk was measured against the stored reference distributions.
        rec = dep_c.records[c]
        names = da.dtype.names or ()
        if exact and "kld" in names and ("same_top" in names or ("argmax" in names and "argmax" in (ra.dtype.names or ())))\
                and (rec.kld_reference or reference) == reference:
            delta_p = np.exp(-dep_c.nll[c]) - np.exp(-ref_c.nll[c])
            same = da["same_top"].astype(bool) if "same_top" in names else np.asarray(da["argmax"]) == np.asarray(ra["argmax"])
            per_chunk[c] = TokenDrift(np.asarray(da["kld"], dtype=np.float64), np.asarray(same), delta_p)
        else:
            exact = False
    complete_bound = len(bound) == len(shared)
    if not exact:
        if not complete_bound:  # no top-k on a side (a v2 exact-KLD deployment or KLD reference keeps none)
            return Pair(ref_c, dep_c, shared, shared, None, {}, None, top_k)
        return Pair(ref_c, dep_c, shared, shared, None, bound, summarize_drift(_concat([bound[c] for c in shared])), top_k)
    summary = summarize_drift(_concat([per_chunk[c] for c in shared]), exact=True)
    bias = None
    if complete_bound and top_k and summary.kld_mean > 0:
        bias = 1.0 - fsum_mean(_concat([bound[c] for c in shared]).kld) / summary.kld_mean
    return Pair(ref_c, dep_c, shared, shared, None, per_chunk, summary, top_k, bias)


def _bound_chunk(ra: np.ndarray, da: np.ndarray) -> TokenDrift | None:
    """The top-k + tail bound of one chunk from both sides' side-file arrays (None: a side kept no top-k)."""
    if not all("top_ids" in (a.dtype.names or ()) and a.dtype["top_ids"].shape and a.dtype["top_ids"].shape[0] > 0 for a in (ra, da)):
        return None
    return token_drift_arrays(np.asarray(ra["token"]), np.asarray(ra["nll"], dtype=np.float64), np.asarray(da["nll"], dtype=np.float64),
                              np.asarray(ra["top_ids"]), np.asarray(ra["top_lp"]), np.asarray(da["top_ids"]), np.asarray(da["top_lp"]))


def _concat(drifts: list[Any]) -> TokenDrift:
    return TokenDrift(
        np.concatenate([d.kld for d in drifts]) if drifts else np.zeros(0),
        np.concatenate([d.same_top for d in drifts]) if drifts else np.zeros(0, dtype=bool),
        np.concatenate([d.delta_p for d in drifts]) if drifts else np.zeros(0),
    )


# -- drift by position in the context -----------------------------------------------------------------------------

FIRST_BUCKET_END = 512  # buckets: [0, 512), [512, 1K), [1K, 2K), [2K, 4K), [4K, 8K), ... (each doubling the last)
POSITION_PREFIX = "pos "  # a bucket's score rows carry category "pos 0-512", "pos 512-1K", ...
POSITION_METRICS = ("pos_kld", "pos_top1_agreement", "pos_nll_diff")


def position_buckets(end: int) -> list[tuple[int, int]]:
    """The position buckets covering positions 0 .. end - 1."""
    out, lo, hi = [], 0, FIRST_BUCKET_END
    while lo < end:
        out.append((lo, hi))
        lo, hi = hi, 2 * hi
    return out


def bucket_label(lo: int, hi: int) -> str:
    def size(n: int) -> str:
        return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)

    return f"{size(lo)}-{size(hi)}"


@dataclass(frozen=True)
class BucketDrift:
    """KLD, top-1 agreement and NLL difference (deployment minus the KLD pair's reference) of the scored tokens whose
    position in their chunk (the index of the predicted token) lies in [start, end): block-clustered means."""

    start: int
    end: int
    kld: BlockMean
    top1: BlockMean
    nll_diff: BlockMean

    @property
    def label(self) -> str:
        return bucket_label(self.start, self.end)

    @property
    def n_tokens(self) -> int:
        return self.kld.n_tokens


def position_drift(pair: Pair, alpha: float) -> list[BucketDrift]:
    """Per position bucket, from the per-token arrays the pair already holds (side files): buckets without a scored
    token are left out. Token-weighted, the buckets' means add up to the pair's whole-run figures."""
    slices: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for c in pair.dep_ids:
        d = pair.per_chunk.get(c)
        first = pair.dep.records[c].scored_from
        if d is None or first is None or c not in pair.ref.nll:
            continue
        n = int(np.asarray(d.kld).size)
        nll_diff = pair.dep.nll[c] - pair.ref.nll[c]
        for lo, hi in position_buckets(first + n):
            a, b = max(lo - first, 0), min(hi - first, n)
            if a < b:
                slices.setdefault((lo, hi), []).append(
                    (np.asarray(d.kld[a:b], dtype=np.float64), np.asarray(d.same_top[a:b], dtype=np.float64), nll_diff[a:b]))
    out = []
    for (lo, hi), parts in sorted(slices.items()):
        out.append(BucketDrift(lo, hi, block_clustered_mean([p[0] for p in parts], alpha),
                               block_clustered_mean([p[1] for p in parts], alpha),
                               block_clustered_mean([p[2] for p in parts], alpha)))
    return out


def first_bucket_below(buckets: list[BucketDrift], threshold: float) -> BucketDrift | None:
    """The first position bucket whose top-1 agreement with the reference is below `threshold` (None: none is)."""
    return next((b for b in buckets if b.top1.mean < threshold), None)


def position_rows(dep: str, suite: str, buckets: list[BucketDrift], threshold: float) -> list[ScoreRow]:
    """One row per bucket and metric (category "pos <bucket>"), and the headline `top1_below_from`: the first
    bucket's start position (tokens) where top-1 agreement falls below the threshold, NaN when none does (its
    category names the bucket; its interval is that bucket's top-1 agreement row's)."""
    rows = []
    for b in buckets:
        cat = POSITION_PREFIX + b.label
        for metric, m in zip(POSITION_METRICS, (b.kld, b.top1, b.nll_diff)):
            rows.append(ScoreRow(dep, suite, cat, metric, m.mean, m.ci_low, m.ci_high, m.n_tokens))
    if buckets:
        below = first_bucket_below(buckets, threshold)
        cat = POSITION_PREFIX + below.label if below is not None else CATEGORY
        rows.append(ScoreRow(dep, suite, cat, "top1_below_from", float(below.start) if below is not None else math.nan,
                             None, None, below.n_tokens if below is not None else sum(b.n_tokens for b in buckets)))
    return rows
