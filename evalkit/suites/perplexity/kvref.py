"""`suites.perplexity.kv_reference: true`: each deployment with a quantized KV cache is also compared with the
deployment of the same run that holds the same weights (same files, by the manifest's sha256) on the same engine
with a 16-bit KV cache, so the KV cache's effect is separated from the weights'. No config naming is needed: the
twin is found from the deployments' options (EngineSpec.kv_precision) and fingerprints.

Rows (score rows of the quantized-KV deployment, against its twin): `kv_kld` and `kv_top1_agreement` over every
scored token, the same by position bucket (`kv_pos_kld`, `kv_pos_top1_agreement`, category "pos <bucket>"), and
`kv_top1_below_from` (the first bucket below the suite's top1_threshold). KLD is the top-k + tail lower bound
from both side files (exact where both sides kept full distributions is not needed: same engine, same top_k).
"""
from __future__ import annotations

import math
from typing import Any

from evalkit.engines import engine_spec
from evalkit.store import ScoreRow
from evalkit.suites.base import ScoreContext
from evalkit.suites.perplexity.chunking import CATEGORY
from evalkit.suites.perplexity.scoring import (
    POSITION_PREFIX, first_bucket_below, pair_chunks, position_drift, same_weights,
)

FULL_KV = ("f16", "bf16", "f32", "float16", "bfloat16", "float32", "auto")  # labels (first word) of a 16/32-bit cache


def is_full_kv(label: str) -> bool:
    return label.split(" ")[0] in FULL_KV or label.endswith("(auto)")


def kv_twins(ctx: ScoreContext, names: list[str]) -> dict[str, str]:
    """Quantized-KV deployment -> its full-KV twin (same engine, same weight files); deployments without one are
    left out."""
    config = ctx.config
    deps = {d.name: d for d in getattr(config, "deployments", []) or []}
    labels = {n: engine_spec(deps[n].engine).kv_precision_of(deps[n].options) for n in names if n in deps}
    out: dict[str, str] = {}
    for n, label in labels.items():
        if not label or is_full_kv(label):
            continue
        twin = next((o for o in names if o != n and o in labels and labels[o] and is_full_kv(labels[o])
                     and deps[o].engine == deps[n].engine and same_weights(ctx.manifest, n, o)), None)
        if twin is not None:
            out[n] = twin
    return out


def kv_reference_rows(suite: str, chunks: dict[str, Any], ctx: ScoreContext, threshold: float) -> list[ScoreRow]:
    rows: list[ScoreRow] = []
    alpha = ctx.stats.alpha
    for dep, twin in kv_twins(ctx, list(chunks)).items():
        pair = pair_chunks(chunks[twin], chunks[dep], twin)
        if pair.reason is not None or pair.drift is None:
            continue
        d = pair.drift
        lo, hi = d.same_top_ci
        rows.append(ScoreRow(dep, suite, CATEGORY, "kv_kld", d.kld_mean, None, None, d.n_tokens))
        rows.append(ScoreRow(dep, suite, CATEGORY, "kv_top1_agreement", d.same_top, lo, hi, d.n_tokens))
        buckets = position_drift(pair, alpha)
        for b in buckets:
            cat = POSITION_PREFIX + b.label
            rows.append(ScoreRow(dep, suite, cat, "kv_pos_kld", b.kld.mean, b.kld.ci_low, b.kld.ci_high, b.kld.n_tokens))
            rows.append(ScoreRow(dep, suite, cat, "kv_pos_top1_agreement", b.top1.mean, b.top1.ci_low, b.top1.ci_high, b.top1.n_tokens))
        if buckets:
            below = first_bucket_below(buckets, threshold)
            rows.append(ScoreRow(dep, suite, POSITION_PREFIX + below.label if below else CATEGORY, "kv_top1_below_from",
                                 float(below.start) if below else math.nan, None, None,
                                 below.n_tokens if below else sum(b.n_tokens for b in buckets)))
    return rows
