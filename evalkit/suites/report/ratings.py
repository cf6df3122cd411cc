"""The ratings suite in the report (evalkit/suites/ratings.py): imported blind human ratings in their own section,
after the section of the suite whose outputs were rated (SuiteSpec.rated_outputs), and as the verdict's first
columns (a suite scored from the run directory's files leads the verdict)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import pandas as pd

from evalkit.report import plots as P
from evalkit.report.cells import CATEGORIES, CATEGORY_LABEL, Cell, Table, cell, fmt, fmt_interval, isnum, plain, signed, spec_for
from evalkit.report.render import Section, some
from evalkit.report.verdict import Column
from evalkit.report.view import RunView
from evalkit.suites.ratings import NAME


def section(view: RunView) -> Section | None:
    if not view.human:
        return None
    return Section("human", "Human ratings", "Blind ratings imported from the rating sheets, de-blinded with the run's key.",
                   human_tables(view), some(P.human_plot(view)))


def human_cell(view: RunView, dep: str, category: str) -> Cell:
    """A mean rating cell, read like any metric: the ratings suite's rows of scores.csv / comparisons.csv."""
    c = view.cell(dep, NAME, category, "rating")
    absolute = view.human.get("absolute", pd.DataFrame())
    a = absolute[(absolute.deployment == dep) & (absolute.category == category)] if not absolute.empty else absolute
    if a.empty or not c.note or c.note == "reference":
        return c
    return replace(c, note=f"{c.note}; {int(a.iloc[0]['n_raters'])} raters")


def _human_cells(view: RunView, category: str) -> Callable[[str], Cell]:
    return lambda d: human_cell(view, d, category)


def verdict_columns(view: RunView) -> list[Column]:
    """A mean-rating column per category, when absolute ratings were imported."""
    if view.human.get("absolute", pd.DataFrame()).empty:
        return []
    return [Column("human rating (1–5)", CATEGORY_LABEL[cat], _human_cells(view, cat), f"{CATEGORY_LABEL[cat]} rating")
            for cat in CATEGORIES]


def human_tables(view: RunView) -> list[Table]:
    h = view.human
    if not h:
        return []
    out = []
    absolute = h.get("absolute", pd.DataFrame())
    if not absolute.empty:
        cats = [c for c in list(CATEGORIES) + ["all"] if c in set(absolute.category)]
        rows = [[Cell(d, "(reference)" if d == view.reference else "")] + [human_cell(view, d, c) for c in cats]
                for d in view.deployments if d in set(absolute.deployment)]
        out.append(Table("human-absolute", "Mean rating (1–5) by category", ["deployment"] + [CATEGORY_LABEL[c] for c in cats],
                         rows, "Intervals resample whole items (two raters on one output are not two observations).",
                         numeric=True))
    pw = h.get("pairwise", pd.DataFrame())
    if not pw.empty:
        rows = []
        pct = spec_for(NAME, "win_rate").kind
        for r in pw.itertuples():
            net = cell({"value": r.net, "ci_low": r.net_low, "ci_high": r.net_high}, None, spec_for(NAME, "net_preference"))
            rows.append([Cell(r.deployment), Cell(CATEGORY_LABEL.get(r.category, r.category)), plain(r.n_ratings),
                         Cell(fmt(r.win_rate, pct), fmt_interval(r.win_low, r.win_high, pct)),
                         Cell(fmt(r.tie_rate, pct), fmt_interval(r.tie_low, r.tie_high, pct)),
                         Cell(fmt(r.loss_rate, pct), fmt_interval(r.loss_low, r.loss_high, pct)),
                         Cell(signed(f"{r.net:+.2f}"), net.interval)])
        out.append(Table("human-pairwise", f"Side by side with the reference ({view.reference})",
                         ["deployment", "category", "ratings", "win", "tie", "loss", "net (win − loss)"], rows,
                         "Win/tie/loss: Wilson intervals per rating; net: item bootstrap."))
    ag = h.get("agreement", pd.DataFrame())
    if not ag.empty:
        rows = [[Cell(r.mode), Cell(CATEGORY_LABEL.get(r.category, r.category)),
                 Cell(fmt(r.alpha) if isnum(r.alpha) else "undefined"), plain(r.n_raters), plain(r.n_items),
                 plain(r.n_pairable_units)] for r in ag.itertuples()]
        out.append(Table("human-agreement", "Agreement between raters (Krippendorff's alpha, ordinal)",
                         ["mode", "category", "alpha", "raters", "items", "outputs rated twice+"], rows,
                         "1 = perfect agreement, 0 = chance; below ~0.67 conclusions from the ratings are tentative."))
    return out
