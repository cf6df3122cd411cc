"""The long-context suite in the report: repetition and recall by length, the recall grid, examples, verdict.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from evalkit.report.cells import Cell, Example, Table, better_note, cut, plain
from evalkit.report.render import Section
from evalkit.report.tables import metric_table
from evalkit.report.verdict import Column
from evalkit.report.view import RunView
from evalkit.report.plots import Plot, drawn, figure, legend, png, style, triple

if TYPE_CHECKING:
    from matplotlib.axes import Axes

SUITE = "longcontext"


def longcontext_tables(view: RunView) -> list[Table]:
    s = view.suite_scores("longcontext")
    if s.empty:
        return []
    lengths = sorted({str(c) for c in s.category if str(c).startswith("L")}, key=lambda c: int(c[1:]))
    out = []
    for metric, title in (("seq_rep_4", "Repetition (seq-rep-4) by context length"),
                          ("distinct_2", "Distinct bigrams (distinct-2) by context length"),
                          ("recall_accuracy", "Pass-key recall by context length")):
        cols = [(f"{c[1:]} tokens", "longcontext", c, metric) for c in lengths]
        if metric == "recall_accuracy":
            cols.append(("all lengths", "longcontext", "all", metric))
        t = metric_table(view, f"longcontext-{metric}", title, cols)
        if not t.empty:
            out.append(t)
    out += _task_tables(view, s, lengths)
    skipped = s[s.metric == "skipped_items"]
    if not skipped.empty:
        rows = [[Cell(r.deployment), Cell(f"{str(r.category)[1:]} tokens"), plain(int(r.value))] for r in skipped.itertuples()]
        out.append(Table("longcontext-skipped", "Lengths not run", ["deployment", "length", "items skipped"], rows,
                         "The prompt plus the tokens to generate did not fit the engine's context (n_ctx)."))
    return out

def _task_tables(view: RunView, s: Any, lengths: list[str]) -> list[Table]:
    """RULER-style tasks: accuracy by task and length (paired flips in the comparison table), and each
    deployment's effective length per task."""
    from evalkit.suites.longtasks import TASKS

    out: list[Table] = []
    tasks = [t for t in TASKS if (s.category.astype(str) == f"{t} all").any()]
    for task in tasks:
        cols = [(f"{c[1:]} tokens", SUITE, f"{task} {c}", "task_accuracy") for c in lengths]
        t = metric_table(view, f"longcontext-task-{task}", f"{task}: exact answers by context length",
                         [*cols, ("all lengths", SUITE, f"{task} all", "task_accuracy")])
        if not t.empty:
            out.append(t)
    eff = s[s.metric == "effective_length"]
    if not eff.empty:
        rows = [[Cell(d), *[plain(_eff(eff, d, t)) for t in tasks]] for d in view.deployments]
        out.append(Table("longcontext-effective-length", "Effective length by task", ["deployment", *tasks], rows,
                         "The longest context length whose task accuracy is at or above the threshold "
                         "(suites.longcontext.effective_threshold); 0: no length reached it."))
    return out


def _eff(eff: Any, dep: str, task: str) -> str:
    v = eff[(eff.deployment == dep) & (eff.category.astype(str) == task)].value
    return "–" if v.empty else f"{int(v.iloc[0]):,}"


def longcontext_examples(view: RunView) -> list[Example]:
    """The repetition continuation at the longest length each deployment ran, side by side."""
    recs = view.records("longcontext")
    done = {d: [r for r in rs if r.get("kind") == "rep" and "skipped" not in r] for d, rs in recs.items()}
    lengths = [max((r["length_target"] for r in rs), default=0) for rs in done.values() if rs]
    if not lengths:
        return []
    longest = min(lengths)  # the longest length every deployment reached
    outs = [(d, "", cut(r.get("generation", {}).get("output_text", ""))) for d, rs in done.items() for r in rs if r["length_target"] == longest]
    return [Example(f"continuation after {longest} tokens of context", "", outs)]

def _longest_length(view: RunView, metric: str) -> str | None:
    """The longest context length at which every deployment has `metric` (so the column compares like with like)."""
    s = view.suite_scores("longcontext")
    if s.empty:
        return None
    s = s[(s.metric == metric) & s.category.astype(str).str.match(r"^L\d+$")]
    common = None
    for dep in view.deployments:
        cats = set(s[s.deployment == dep].category.astype(str))
        common = cats if common is None else common & cats
    return max(common, key=lambda c: int(c[1:])) if common else None

def _k(category: str) -> str:
    n = int(category[1:])
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)

def _length_axis(ax: Axes, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")
    ax.grid(alpha=0.3)

def longcontext_plots(view: RunView) -> list[Plot]:
    s = view.suite_scores("longcontext")
    if s.empty:
        return []
    lengths = sorted({int(str(c)[1:]) for c in s.category if str(c).startswith("L")})
    lines = {}
    for d in view.deployments:
        rep = [view.score(d, "longcontext", f"L{n}", "seq_rep_4") for n in lengths]
        rec = [view.score(d, "longcontext", f"L{n}", "recall_accuracy") for n in lengths]
        lines[d] = {"rep": [[n, 100 * float(r["value"])] for n, r in zip(lengths, rep) if r is not None],
                    "recall": [[n, *triple(r)] for n, r in zip(lengths, rec) if r is not None]}
    spec = {"style": style(view), "lengths": lengths, "lines": lines,
            "rep_label": "seq-rep-4 (% repeated 4-grams)" + better_note("longcontext", "seq_rep_4"),
            "recall_label": "recall (%) with Wilson interval" + better_note("longcontext", "recall_accuracy")}
    out = [Plot("longcontext-lengths", "Repetition and recall by context length",
                drawn("longcontext-lengths", spec, _draw_longcontext),
                "Line plots of repetition and pass-key recall against context length per deployment")]
    heat = recall_heatmap(view)
    return out + ([heat] if heat else [])

def _draw_longcontext(spec: dict[str, Any]) -> bytes:
    style, lengths = spec["style"], spec["lengths"]
    deps = style["deployments"]
    fig, (ax1, ax2) = figure(9.0, 3.2, ncols=2)
    for k, d in enumerate(deps):
        dodge = 2 ** ((k - (len(deps) - 1) / 2) * 0.06)  # side by side on the log axis: equal values stay visible
        col, label = style["colors"][d], style["labels"][d]
        rep, rec = spec["lines"][d]["rep"], spec["lines"][d]["recall"]
        if rep:
            ax1.plot([n * dodge for n, _ in rep], [y for _, y in rep], "o-", color=col, label=label)
        if rec:
            v = np.array([r[1:] for r in rec]) * 100
            ax2.errorbar([r[0] * dodge for r in rec], v[:, 0], yerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]], fmt="o-",
                         color=col, capsize=3, label=label)
    for ax, title, ylabel in ((ax1, "Repetition of the continuation", spec["rep_label"]),
                              (ax2, "Pass-key recall", spec["recall_label"])):
        _length_axis(ax, lengths)
        ax.set_ylim(-4, 104)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
    legend(fig, ax1)
    return png(fig)

def recall_heatmap(view: RunView) -> Plot | None:
    items = view.items("longcontext")
    if items.empty or "kind" not in items:
        return None
    rec = items[items.kind == "recall"]
    if rec.empty:
        return None
    lengths = sorted(int(x) for x in rec.length_target.astype(int).unique())
    depths = sorted(float(x) for x in rec.depth.astype(float).unique())
    deps = [d for d in view.deployments if d in set(rec.deployment)]
    grids = {}
    for d in deps:
        grid: list[list[float]] = [[math.nan] * len(lengths) for _ in depths]
        for r in rec[rec.deployment == d].itertuples():
            if isinstance(r.skipped, str) and r.skipped:
                continue
            ok = str(r.correct).lower() in ("true", "1", "1.0")
            grid[depths.index(float(r.depth))][lengths.index(int(r.length_target))] = 1.0 if ok else 0.0
        grids[d] = grid
    spec = {"lengths": lengths, "depths": depths, "deployments": deps, "grids": grids}
    return Plot("longcontext-recall-heatmap", "Pass-key recall by length × depth (✓ found, ✗ missed, – not run)",
                drawn("longcontext-recall-heatmap", spec, _draw_recall_heatmap),
                "Grid per deployment of recall success by context length and needle depth")

def _draw_recall_heatmap(spec: dict[str, Any]) -> bytes:
    from matplotlib.colors import ListedColormap

    lengths, depths, deps = spec["lengths"], spec["depths"], spec["deployments"]
    fig, axes = figure(2.3 * len(deps) + 0.8, 0.45 * len(depths) + 1.5, ncols=len(deps))
    cmap = ListedColormap(["#e06666", "#6aa84f"]).with_extremes(bad="#dddddd")
    for ax, d in zip(axes, deps):
        grid = np.array(spec["grids"][d], dtype=float)
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "–" if np.isnan(v) else ("✓" if v else "✗"), ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{x:.0%}" for x in depths], fontsize=8)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("length")
    axes[0].set_ylabel("needle depth")
    return png(fig)


def section(view: RunView) -> Section:
    return Section(SUITE, "Long context: repetition and recall", "",
                   longcontext_tables(view), longcontext_plots(view), longcontext_examples(view))


def verdict_columns(view: RunView) -> list[Column]:
    cols: list[Column] = []
    length = _longest_length(view, "seq_rep_4")
    if length:
        cols.append(Column("long context", f"repetition @{_k(length)}",
                           lambda d: view.cell(d, SUITE, length, "seq_rep_4"), f"repetition @{_k(length)}"))
    if view.score(view.reference, SUITE, "all", "recall_accuracy") is not None:
        cols.append(Column("long context", "recall", lambda d: view.cell(d, SUITE, "all", "recall_accuracy"),
                           "pass-key recall"))
    return cols
