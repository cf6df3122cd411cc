"""The judge's statistics: ordinal Krippendorff's alpha between two sources (the judge and the humans) with an
item bootstrap, and the slope of a verdict on answer length with an item bootstrap.

Hand-written rather than `krippendorff.alpha` in a loop: a bootstrap needs thousands of alphas per category and
the coverage study millions. Alpha is a function of the coincidence matrix alone, so each item's coincidences
are summed once and every resample is one weighted sum (tests/test_judge.py checks the values against the
`krippendorff` package). Items, not outputs or ratings, are resampled: the deployments' outputs of one item and
the ratings of one output are not independent observations.

Coverage of both intervals at the prompts suite's sizes: tests/test_coverage.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from evalkit.metrics.stats import MIN_ITEMS_FOR_INTERVAL, TOO_FEW_ITEMS, StatsSettings

LEVELS = 5  # 1-5 scores


def ordinal_alpha(coincidence: np.ndarray) -> np.ndarray:
    """Ordinal Krippendorff's alpha of coincidence matrices (`[..., V, V]`, values 1..V): NaN where undefined
    (fewer than two pairable values, or one value only). Krippendorff (2011), "Computing Krippendorff's
    alpha-reliability", ordinal metric: delta(c, k) = sum_{g=c..k} n_g - (n_c + n_k) / 2."""
    o = np.asarray(coincidence, dtype=float)
    n_g = o.sum(axis=-1)
    n = n_g.sum(axis=-1)
    cum = np.cumsum(n_g, axis=-1)
    v = o.shape[-1]
    c, k = np.meshgrid(np.arange(v), np.arange(v), indexing="ij")
    lo, hi = np.minimum(c, k), np.maximum(c, k)
    between = cum[..., hi] - cum[..., lo] + n_g[..., lo]  # sum of n_g for g in [lo, hi]
    delta2 = (between - (n_g[..., lo] + n_g[..., hi]) / 2.0) ** 2
    d_o = (o * delta2).sum(axis=(-2, -1))
    d_e = (n_g[..., :, None] * n_g[..., None, :] * delta2).sum(axis=(-2, -1)) / np.maximum(n - 1, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = 1.0 - d_o / d_e
    return np.where((n >= 2) & (d_e > 0), out, np.nan)


def unit_coincidence(values: Sequence[int]) -> np.ndarray:
    """One unit's coincidences: each ordered pair of its values (from different sources) over m - 1."""
    out = np.zeros((LEVELS, LEVELS))
    vals = [int(v) - 1 for v in values]
    m = len(vals)
    if m < 2:
        return out
    for i, a in enumerate(vals):
        for j, b in enumerate(vals):
            if i != j:
                out[a, b] += 1.0 / (m - 1)
    return out


@dataclass(frozen=True)
class AlphaEstimate:
    alpha: float
    ci_low: float | None
    ci_high: float | None
    n_items: int
    n_units: int
    method: str


def _percentile(boots: np.ndarray, st: StatsSettings) -> tuple[float | None, float | None]:
    finite = boots[np.isfinite(boots)]
    if len(finite) < 0.99 * len(boots):  # too many resamples where the statistic is undefined
        return None, None
    lo, hi = np.percentile(finite, [100 * st.alpha / 2, 100 * (1 - st.alpha / 2)])
    return float(lo), float(hi)


def _weights(n: int, st: StatsSettings) -> np.ndarray:
    """bootstrap_samples x n: how many times each item is drawn in each resample."""
    rng = np.random.default_rng(st.seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=st.bootstrap_samples).astype(float)


def alpha_by_item(units: Sequence[tuple[Hashable, Sequence[int]]], st: StatsSettings | None = None) -> AlphaEstimate:
    """Alpha over units (each: its item, the values its sources gave), with a percentile interval from
    resampling items (none below MIN_ITEMS_FOR_INTERVAL items)."""
    s = st or StatsSettings()
    per_item: dict[Hashable, np.ndarray] = {}
    n_units = 0
    for item, values in units:
        if len(values) < 2:
            continue
        n_units += 1
        per_item[item] = per_item.get(item, np.zeros((LEVELS, LEVELS))) + unit_coincidence(values)
    if not per_item:
        return AlphaEstimate(math.nan, None, None, 0, 0, "no unit with two values")
    stack = np.stack(list(per_item.values()))
    value = float(ordinal_alpha(stack.sum(axis=0)))
    n = len(stack)
    if n < MIN_ITEMS_FOR_INTERVAL or not math.isfinite(value):
        why = f"{TOO_FEW_ITEMS} ({n} < {MIN_ITEMS_FOR_INTERVAL} items)" if math.isfinite(value) else "undefined"
        return AlphaEstimate(value, None, None, n, n_units, why)
    boots = ordinal_alpha(np.einsum("bi,ivw->bvw", _weights(n, s), stack))
    lo, hi = _percentile(boots, s)
    method = f"item bootstrap (percentile, {s.bootstrap_samples} resamples)" if lo is not None else "no interval (alpha undefined in resamples)"
    return AlphaEstimate(value, lo, hi, n, n_units, method)


@dataclass(frozen=True)
class Slope:
    slope: float
    ci_low: float | None
    ci_high: float | None
    n_items: int
    n: int
    method: str


def _ols_slope(s: np.ndarray) -> np.ndarray:
    """Slope from summed (n, x, y, xx, xy) along the last axis; NaN where x does not vary."""
    n, x, y, xx, xy = (s[..., i] for i in range(5))
    with np.errstate(invalid="ignore", divide="ignore"):
        den = n * xx - x * x
        out = (n * xy - x * y) / den
    return np.where(den > 1e-12 * np.maximum(n * xx, 1.0), out, np.nan)


def slope_by_item(points: Sequence[tuple[Hashable, float, float]], st: StatsSettings | None = None) -> Slope:
    """Least-squares slope of y on x over (item, x, y) points, with a percentile interval from resampling items
    (none below MIN_ITEMS_FOR_INTERVAL items)."""
    s = st or StatsSettings()
    per_item: dict[Hashable, np.ndarray] = {}
    for item, x, y in points:
        per_item[item] = per_item.get(item, np.zeros(5)) + np.array([1.0, x, y, x * x, x * y])
    if not per_item:
        return Slope(math.nan, None, None, 0, 0, "no points")
    stack = np.stack(list(per_item.values()))
    value = float(_ols_slope(stack.sum(axis=0)))
    n = len(stack)
    if n < MIN_ITEMS_FOR_INTERVAL or not math.isfinite(value):
        why = f"{TOO_FEW_ITEMS} ({n} < {MIN_ITEMS_FOR_INTERVAL} items)" if math.isfinite(value) else "length does not vary"
        return Slope(value, None, None, n, len(points), why)
    boots = _ols_slope(_weights(n, s) @ stack)
    lo, hi = _percentile(boots, s)
    return Slope(value, lo, hi, n, len(points), f"item bootstrap (percentile, {s.bootstrap_samples} resamples)")
