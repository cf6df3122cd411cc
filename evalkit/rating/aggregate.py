"""Human ratings -> tables: mean scores, paired differences vs the reference, win rates, agreement.

Items are the unit of resampling everywhere: two raters scoring the same output are not two
independent observations, so every bootstrap draws whole items (with all their ratings).
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from evalkit.config import CATEGORIES
from evalkit.metrics.agreement import agreement, as_row
from evalkit.metrics.stats import TOO_FEW_ITEMS, StatsSettings, clustered_mean, excludes_zero, paired_mean_diff, wilson_ci
from evalkit.rating.export import SCORE_MAX, SCORE_MIN
from evalkit.rating.import_ import imported_dir
from evalkit.suites.ratings import NAME as SUITE  # the ratings suite's name, from its spec
from evalkit.store import (
    COMPARISON_COLUMNS, COMPARISONS_CSV, SCORE_COLUMNS, SCORES_CSV, ComparisonRow, RunDir, ScoreRow, atomic_write_text, rows_to_csv,
)

ALL = "all"
OUTCOME_VALUE = {"loss": -1, "tie": 0, "win": 1}
RATING_COLUMNS = ["rater_id", "mode", "item_id", "category", "deployment", "reference", "score", "choice",
                  "preferred", "outcome", "comment", "sheet_id", "row_id"]
TABLE_COLUMNS = {
    "absolute": ["deployment", "category", "mean", "ci_low", "ci_high", "n_ratings", "n_items", "n_raters",
                 "method"],
    "absolute_vs_reference": ["deployment", "reference", "category", "value", "reference_value", "diff", "ci_low",
                              "ci_high", "n_items", "significant", "method"],
    "pairwise": ["deployment", "reference", "category", "n_ratings", "n_items", "wins", "ties", "losses",
                 "win_rate", "win_low", "win_high", "tie_rate", "tie_low", "tie_high", "loss_rate", "loss_low",
                 "loss_high", "net", "net_low", "net_high"],
    "agreement": ["mode", "category", "alpha", "level", "n_raters", "n_items", "n_units", "n_pairable_units"],
}


def ratings_frame(run_dir: Path) -> pd.DataFrame:
    """Every imported rating, de-blinded: one row per (rater, item, deployment[, vs reference]).

    Rows a rater left blank are stored on import but are not ratings, so they are left out here.
    """
    rows: list[dict[str, Any]] = []
    for path in sorted(imported_dir(Path(run_dir)).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        rows += [{"mode": data["mode"], **r} for r in data["rows"]
                 if r.get("score") is not None or r.get("choice") is not None]
    frame = pd.DataFrame(rows, columns=RATING_COLUMNS)
    frame["score"] = pd.to_numeric(frame["score"], errors="coerce")
    return frame


def aggregate(run_dir: Path, st: StatsSettings | None = None) -> dict[str, pd.DataFrame]:
    """Tables keyed "absolute", "absolute_vs_reference", "pairwise", "agreement" (empty when no ratings); `st`: the
    run's statistical policy (None: read from its manifest, as scoring's ScoreContext.stats reads it)."""
    manifest = RunDir.open(Path(run_dir)).manifest()
    reference = str(manifest["reference"])
    if st is None:
        st = StatsSettings.model_validate(manifest.get("config", {}).get("stats") or {})
    frame = ratings_frame(run_dir)
    absolute = frame[(frame["mode"] == "absolute") & frame["score"].notna()]
    pairwise = frame[(frame["mode"] == "pairwise") & frame["outcome"].notna()].copy()
    pairwise["value"] = pairwise["outcome"].map(OUTCOME_VALUE)
    tables = {
        "absolute": _absolute(absolute, st),
        "absolute_vs_reference": _versus_reference(absolute, reference, st),
        "pairwise": _pairwise(pairwise, reference, st),
        "agreement": pd.DataFrame(
            _agreement(absolute, "absolute", "score", list(range(SCORE_MIN, SCORE_MAX + 1)))
            + _agreement(pairwise, "pairwise", "value", [-1, 0, 1])
        ),
    }
    return {name: t.reindex(columns=TABLE_COLUMNS[name]) for name, t in tables.items()}


def _by_category(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Each category in the suite's order, then all categories together."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    cats = sorted(frame["category"].unique(), key=lambda c: (order.get(c, len(order)), str(c)))
    return [(c, frame[frame["category"] == c]) for c in cats] + ([(ALL, frame)] if len(frame) else [])


def _item_cluster_mean(frame: pd.DataFrame, column: str, st: StatsSettings) -> tuple[float, float, float, str]:
    """Mean of all values with a bootstrap CI that resamples whole items (ratings cluster by item)."""
    per_item = frame.groupby("item_id")[column].agg(["sum", "count"])
    m = clustered_mean(per_item["sum"].to_numpy(float), per_item["count"].to_numpy(float), st)
    return m.mean, m.ci_low, m.ci_high, m.method


def _absolute(frame: pd.DataFrame, st: StatsSettings) -> pd.DataFrame:
    rows = []
    for dep, d in frame.groupby("deployment", sort=True):
        for cat, c in _by_category(d):
            mean, low, high, method = _item_cluster_mean(c, "score", st)
            rows.append({"deployment": dep, "category": cat, "mean": mean, "ci_low": low, "ci_high": high,
                         "n_ratings": len(c), "n_items": c["item_id"].nunique(),
                         "n_raters": c["rater_id"].nunique(), "method": method})
    return pd.DataFrame(rows)


def _versus_reference(frame: pd.DataFrame, reference: str, st: StatsSettings) -> pd.DataFrame:
    """Deployment minus reference, paired by item; each side first averaged over its raters."""
    item_means = frame.groupby(["deployment", "category", "item_id"])["score"].mean()
    rows: list[dict[str, Any]] = []
    if reference not in set(frame["deployment"]):
        return pd.DataFrame(rows)
    ref = item_means.xs(reference, level="deployment")
    for dep in sorted(set(frame["deployment"]) - {reference}):
        mine = item_means.xs(dep, level="deployment")
        paired = pd.concat({"dep": mine, "ref": ref}, axis=1, join="inner").reset_index()
        for cat, c in _by_category(paired):
            diff = paired_mean_diff(c["dep"].to_numpy(), c["ref"].to_numpy(), st)
            rows.append({"deployment": dep, "reference": reference, "category": cat,
                         "value": float(c["dep"].mean()), "reference_value": float(c["ref"].mean()),
                         "diff": diff.diff, "ci_low": diff.ci_low, "ci_high": diff.ci_high, "n_items": diff.n,
                         "significant": diff.excludes_zero, "method": diff.method})
    return pd.DataFrame(rows)


def _pairwise(frame: pd.DataFrame, reference: str, st: StatsSettings) -> pd.DataFrame:
    rows = []
    for dep, d in frame.groupby("deployment", sort=True):
        for cat, c in _by_category(d):
            n = len(c)
            counts = c["outcome"].value_counts()
            row: dict[str, Any] = {"deployment": dep, "reference": reference, "category": cat, "n_ratings": n,
                                   "n_items": c["item_id"].nunique()}
            for outcome, count_col in (("win", "wins"), ("tie", "ties"), ("loss", "losses")):
                k = int(counts.get(outcome, 0))
                # Wilson per rating (ignores rater clustering); the item-bootstrapped `net` CI does not.
                low, high = wilson_ci(k, n, st.alpha)
                row.update({count_col: k, f"{outcome}_rate": k / n, f"{outcome}_low": low, f"{outcome}_high": high})
            row["net"], row["net_low"], row["net_high"], _ = _item_cluster_mean(c, "value", st)
            rows.append(row)
    return pd.DataFrame(rows)


def _agreement(frame: pd.DataFrame, mode: str, column: str, domain: list[int]) -> list[dict[str, Any]]:
    """Alpha per category and overall; a unit is one output (item x deployment) that raters scored."""
    rows = []
    for cat, c in _by_category(frame):
        triples = list(zip(c["rater_id"], zip(c["item_id"], c["deployment"]), c[column]))
        rows.append(as_row(agreement(triples, "ordinal", domain), mode=mode, category=cat,
                           n_items=c["item_id"].nunique()))
    return rows


# -- ratings as a suite in the tidy tables -----------------------------------------------------------

ALL_DEPLOYMENTS = "all"  # agreement rows: alpha is over every rated output, not one deployment's


def _opt(x: Any) -> float | None:
    """NaN (no interval could be formed) is written as an empty cell, like every other suite's."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if v == v else None  # NaN != NaN


def tidy_rows(run_dir: Path, st: StatsSettings | None = None) -> tuple[list[ScoreRow], list[ComparisonRow]]:
    """Imported ratings as suite `ratings` rows of scores.csv and comparisons.csv (none when not rated): the
    ratings suite's rows (evalkit/suites/ratings.py, SuiteSpec.rows), scoring asks for them with the run's `st`.

    scores: `rating` (mean 1-5 per deployment and category, item-bootstrap interval); pairwise sheets'
    `win_rate`/`tie_rate`/`loss_rate` (Wilson) and `net_preference` (item bootstrap); inter-rater
    `krippendorff_alpha` (absolute sheets) / `krippendorff_alpha_pairwise`, deployment "all".
    comparisons: `rating` paired by item against the reference; `net_preference` (already a difference).
    """
    if ratings_frame(run_dir).empty:
        return [], []
    t = aggregate(run_dir, st)
    scores: list[ScoreRow] = []
    comps: list[ComparisonRow] = []
    for r in t["absolute"].itertuples():
        scores.append(ScoreRow(r.deployment, SUITE, r.category, "rating", float(r.mean), _opt(r.ci_low), _opt(r.ci_high),
                               int(r.n_items)))
    for r in t["absolute_vs_reference"].itertuples():
        comps.append(ComparisonRow(r.deployment, r.reference, SUITE, r.category, "rating", float(r.value),
                                   float(r.reference_value), float(r.diff), _opt(r.ci_low), _opt(r.ci_high), None,
                                   int(r.n_items), f"paired by item (raters averaged per output); {r.method}",
                                   excludes_zero(_opt(r.ci_low), _opt(r.ci_high))))
    for r in t["pairwise"].itertuples():
        for outcome in ("win", "tie", "loss"):
            scores.append(ScoreRow(r.deployment, SUITE, r.category, f"{outcome}_rate", float(getattr(r, f"{outcome}_rate")),
                                   _opt(getattr(r, f"{outcome}_low")), _opt(getattr(r, f"{outcome}_high")),
                                   int(r.n_ratings)))
        lo, hi = _opt(r.net_low), _opt(r.net_high)
        scores.append(ScoreRow(r.deployment, SUITE, r.category, "net_preference", float(r.net), lo, hi, int(r.n_items)))
        comps.append(ComparisonRow(r.deployment, r.reference, SUITE, r.category, "net_preference", float(r.net), 0.0,
                                   float(r.net), lo, hi, None, int(r.n_items),
                                   "side by side: win = 1, tie = 0, loss = -1; "
                                   + ("item bootstrap" if lo is not None else TOO_FEW_ITEMS), excludes_zero(lo, hi)))
    for r in t["agreement"].itertuples():
        metric = "krippendorff_alpha" if r.mode == "absolute" else "krippendorff_alpha_pairwise"
        if _opt(r.alpha) is None:
            continue  # undefined (one rater, or no variation): nothing to put in a number column
        scores.append(ScoreRow(ALL_DEPLOYMENTS, SUITE, r.category, metric, float(r.alpha), None, None,
                               int(r.n_pairable_units)))
    return scores, comps


def refresh_tidy_tables(run_dir: Path) -> None:
    """Replace the `ratings` rows of scores.csv and comparisons.csv (after `rate import`); other rows stay
    byte for byte. Files not written yet are left alone: `evalkit report` writes them with the ratings."""
    scores, comps = tidy_rows(run_dir)
    for name, rows, columns in ((SCORES_CSV, scores, SCORE_COLUMNS), (COMPARISONS_CSV, comps, COMPARISON_COLUMNS)):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        kept = [r for r in csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))) if r.get("suite") != SUITE]
        atomic_write_text(path, rows_to_csv([*kept, *rows], columns))
