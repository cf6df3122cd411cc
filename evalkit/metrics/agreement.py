"""Inter-rater agreement: Krippendorff's alpha over a raters x units reliability matrix.

Alpha rather than Cohen's/Fleiss' kappa: it takes any number of raters, tolerates missing ratings
(a rater who skipped rows) and has an ordinal form that fits 1-5 scores. The math is the
`krippendorff` package's; this module only shapes the data and names the edge cases.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Literal, Sequence

import krippendorff
import numpy as np

Level = Literal["nominal", "ordinal", "interval", "ratio"]


@dataclass(frozen=True)
class Agreement:
    """Alpha with what stands behind it: raters with any rating, units rated at all, units rated twice+."""

    alpha: float
    n_raters: int
    n_units: int
    n_pairable_units: int
    level: str


def reliability_matrix(
    ratings: Iterable[tuple[Hashable, Hashable, float]],
) -> tuple[np.ndarray, list[Hashable], list[Hashable]]:
    """(rater, unit, value) triples -> raters x units float matrix with NaN where a rater gave nothing.

    A rater who rated the same unit twice keeps the last value (callers de-duplicate upstream).
    """
    triples = list(ratings)
    raters = sorted({t[0] for t in triples}, key=str)
    units = sorted({t[1] for t in triples}, key=str)
    r_index = {r: i for i, r in enumerate(raters)}
    u_index = {u: j for j, u in enumerate(units)}
    matrix = np.full((len(raters), len(units)), np.nan)
    for rater, unit, value in triples:
        matrix[r_index[rater], u_index[unit]] = float(value)
    return matrix, raters, units


def alpha(matrix: np.ndarray, level: Level = "ordinal", value_domain: Sequence[float] | None = None) -> float:
    """Krippendorff's alpha; NaN when undefined (fewer than 2 raters on any unit, or no variation at all)."""
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] < 2 or _pairable(m) == 0:
        return math.nan
    observed = np.unique(m[~np.isnan(m)])
    domain = np.asarray(value_domain if value_domain is not None else observed, dtype=float)
    if len(observed) < 2:
        return math.nan  # everyone gave the same value: expected disagreement is 0, alpha is 0/0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        value = float(krippendorff.alpha(reliability_data=m, level_of_measurement=level, value_domain=domain))
    return value if math.isfinite(value) else math.nan


def agreement(ratings: Iterable[tuple[Hashable, Hashable, float]], level: Level = "ordinal",
              value_domain: Sequence[float] | None = None) -> Agreement:
    """Alpha of (rater, unit, value) triples, with the counts a reader needs to judge it."""
    matrix, raters, units = reliability_matrix(ratings)
    return Agreement(alpha(matrix, level, value_domain), len(raters), len(units), _pairable(matrix), level)


def _pairable(matrix: np.ndarray) -> int:
    """Units with at least two ratings: only those carry information about agreement."""
    if matrix.size == 0:
        return 0
    return int(np.sum(np.sum(~np.isnan(matrix), axis=0) >= 2))


def as_row(a: Agreement, **labels: Any) -> dict[str, Any]:
    return {**labels, "alpha": a.alpha, "level": a.level, "n_raters": a.n_raters, "n_units": a.n_units,
            "n_pairable_units": a.n_pairable_units}
