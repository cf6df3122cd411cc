"""The verdict table (deployments x headline metrics, each with its difference from the reference) and
the plain-language "how sure are we" line per deployment."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from evalkit.report.cells import (
    Cell, Mark, Table, fmt_interval, isnum, spec_for, z_score,
)
from evalkit.report.view import RunView
from evalkit.suites import all_specs, load_hook


@dataclass(frozen=True)
class Column:
    group: str  # HTML header row 1 (spanning its columns)
    short: str  # HTML header row 2
    get: Callable[[str], Cell]  # deployment -> cell
    full: str = ""  # the name in Markdown and lookups; default "<group> <short>"

    @property
    def label(self) -> str:
        return self.full or f"{self.group} {self.short}"


def flips_cell(view: RunView, dep: str, suite: str, category: str) -> Cell:
    """Flipped pass/fail answers against the reference: how many, which way, and whether they go one way."""
    if dep == view.reference:
        return Cell("–", note="reference")
    rate = view.comp(dep, suite, category, "flip_rate")
    if rate is None:
        return Cell("–")
    n = int(rate["n"])
    r2w = view.comp(dep, suite, category, "flips_right_to_wrong")
    w2r = view.comp(dep, suite, category, "flips_wrong_to_right")
    k_r2w = round(float(r2w["value"]) * n) if r2w is not None else 0
    k_w2r = round(float(w2r["value"]) * n) if w2r is not None else 0
    mark: Mark = "same"
    if bool(rate["significant"]):
        mark = "worse" if k_r2w > k_w2r else "better"
    p = rate.get("p_value")
    return Cell(f"{k_r2w + k_w2r} of {n}", fmt_interval(rate["ci_low"], rate["ci_high"], spec_for(suite, "flip_rate").kind),
                "", f"{k_r2w} ✓→✗, {k_w2r} ✗→✓", mark,
                f"flipped answers vs the reference; p = {float(p):.3g} (McNemar exact: are the flips one-sided?)"
                if isnum(p) else "", z_score(rate) if mark != "same" else 0.0)


def verdict_columns(view: RunView) -> list[Column]:
    """Each suite's own columns (`SuiteSpec.verdict`): first those of suites scored from the run directory's files
    (SuiteSpec.runs False: the human ratings, when imported), then the others, each group in registry order."""
    cols: list[Column] = []
    for spec in sorted(all_specs(), key=lambda s: s.runs):  # a stable sort: registry order within each group
        if spec.verdict is not None:
            cols += load_hook(spec.verdict)(view)
    return cols


def _compact(c: Cell) -> Cell:
    """Verdict cells keep the difference in view; the value's own interval moves to the hover note."""
    if not c.interval:
        return c
    note = f"value 95% interval {c.interval}" + (f"; {c.note}" if c.note else "")
    return replace(c, interval="", note=note)


def verdict(view: RunView) -> Table:
    cols = verdict_columns(view)
    rows = []
    for dep in view.deployments:
        name = Cell(dep, "(reference)" if dep == view.reference else "")
        rows.append([name] + [_compact(c.get(dep)) for c in cols])
    groups: list[tuple[str, int]] = []
    for c in cols:
        if groups and groups[-1][0] == c.group:
            groups[-1] = (c.group, groups[-1][1] + 1)
        else:
            groups.append((c.group, 1))
    human = bool(cols) and cols[0].group.startswith("human")
    if not cols:
        return Table("verdict", "Verdict", ["deployment"], rows, "No scored items yet: nothing to compare. "
                     "Finish the run (evalkit run --resume) or check each deployment's log.")
    caption = ("Ratings are means of blind human ratings with item-bootstrap intervals. " if human else
               "Prompt columns are automatic scores (tests passed, answer found, chrF). ") + (
        f"Each cell: the value; below it Δ, the difference from the reference on the same items, and its {view.level} "
        "interval. "
        "Hover a cell for the method, n and p.")
    return Table("verdict", "Verdict", ["deployment"] + [c.label for c in cols], rows, caption, groups,
                 [c.short for c in cols], numeric=True)


@dataclass(frozen=True)
class Sureness:
    deployment: str
    text: str
    significant: int
    tested: int


def how_sure(view: RunView, table: Table) -> list[Sureness]:
    """One plain sentence per deployment: how many differences are beyond noise, and the biggest of them."""
    out = []
    for row in table.rows:
        dep = row[0].value
        if dep == view.reference:
            continue
        named = list(zip(table.header[1:], row[1:]))
        tested = [(h, c) for h, c in named if c.mark in ("better", "worse", "changed", "same")]
        sig = sorted(((h, c) for h, c in tested if c.mark != "same"), key=lambda hc: -(hc[1].raw or 0))
        no_ci = sum(c.mark == "na" for _, c in named)
        if not tested:
            text = "no difference has an interval yet (too few items)."
        elif not sig:
            text = f"none of {len(tested)} differences is distinguishable from noise at this sample size."
        else:
            parts = [f"{h} {_said(c)}" for h, c in sig[:3]]
            text = (f"{len(sig)} of {len(tested)} differences {'is' if len(sig) == 1 else 'are'} distinguishable "
                    f"from noise; biggest: {parts[0]}" + (f"; then {'; '.join(parts[1:])}" if len(parts) > 1 else "") + ".")
        if no_ci:
            text += f" {no_ci} more {'has' if no_ci == 1 else 'have'} no interval."
        out.append(Sureness(dep, text, len(sig), len(tested)))
    return out


def _said(c: Cell) -> str:
    """A cell's difference in words: "−7.0 pts [−15.0, −2.0]"; KLD "0.131 [0.109, 0.152]"; flips "11 of 100 (…)"."""
    if c.delta:
        return c.diff
    if c.delta_ci.startswith("["):
        return f"{c.value} {c.delta_ci}"
    return f"{c.value} ({c.delta_ci})" if c.delta_ci else c.value
