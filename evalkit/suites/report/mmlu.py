"""The multiple-choice suite (MMLU or evalkit's built-in set) in the report: subjects, flips, plot, verdict.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

from typing import Any

from evalkit.report.cells import Cell, Table, better_note
from evalkit.report.render import Section, some
from evalkit.report.tables import flipped_items, flips_table
from evalkit.report.verdict import Column, flips_cell
from evalkit.report.view import RunView
from evalkit.report.plots import Plot, dots, drawn, figure, legend, png, style, triple

SUITE = "mmlu"


def mmlu_label(view: RunView) -> str:
    """evalkit's built-in set must not be called MMLU (evalkit.suites.mmlu.BUILTIN_LABEL)."""
    label = view.suite_info.get(SUITE, {}).get("dataset")
    if label:
        return "MMLU" if label == "MMLU" else "MC"
    source = ((view.run.manifest.get("config") or {}).get("suites") or {}).get(SUITE, {}) or {}
    return "MC" if source.get("source") == "builtin" else "MMLU"


def mmlu_subject_table(view: RunView) -> Table:
    """Rows = subjects (then all); one column per deployment: accuracy [CI] and its difference."""
    s = view.suite_scores("mmlu")
    if s.empty:
        return Table("mmlu-subjects", "", [], [])
    subjects = sorted({str(c) for c in s[s.metric == "accuracy"].category if str(c) != "all"}) + ["all"]
    rows = [[Cell(sub.replace("_", " "))] + [view.cell(d, "mmlu", sub, "accuracy") for d in view.deployments]
            for sub in subjects]
    return Table("mmlu-subjects", f"{mmlu_label(view)} accuracy by subject", ["subject"] + list(view.deployments), rows,
                 f"Accuracy with Wilson {view.level} intervals; differences: exact McNemar test and the interval that "
                 "inverts it (hover for the paired bootstrap interval).",
                 numeric=True)

def mmlu_plot(view: RunView) -> Plot | None:
    s = view.suite_scores("mmlu")
    if s.empty:
        return None
    subjects = sorted({str(c) for c in s[s.metric == "accuracy"].category if str(c) != "all"}) + ["all"]
    spec = {"style": style(view), "subjects": [x.replace("_", " ") for x in subjects],
            "values": {d: [triple(view.score(d, "mmlu", sub, "accuracy")) for sub in subjects] for d in view.deployments},
            "xlabel": "accuracy (%) with Wilson interval" + better_note("mmlu", "accuracy")}
    return Plot("mmlu-subjects", f"{mmlu_label(view)} accuracy by subject (95% intervals)",
                drawn("mmlu-subjects", spec, _draw_mmlu), "Accuracy per subject and deployment with interval bars")

def _draw_mmlu(spec: dict[str, Any]) -> bytes:
    subjects = spec["subjects"]
    fig, axes = figure(7.5, 0.32 * len(subjects) * max(1, len(spec["style"]["deployments"])) / 2 + 1.4)
    ax = axes[0]
    dots(ax, spec["style"], subjects, spec["values"], 100.0, horizontal=True)
    ax.set_xlim(-2, 102)
    ax.set_xlabel(spec["xlabel"])
    ax.axhline(len(subjects) - 1.5, color="#999999", lw=0.8)
    legend(fig, ax)
    return png(fig)


METHODS = {"answer_top_k_items": "answer-top-k (letters read from the top-k the server returned)",
           "four_continuation_items": "four continuations (each ' X' scored from prompt log-probs)"}


def methods_note(view: RunView) -> str:
    """How each deployment's letters were read (the records' per-item method, counted in the scores), for every
    deployment: a served one may read them otherwise than one pass over the answer position's whole distribution,
    and the report says which way each did even where all did it the same way."""
    s = view.suite_scores(SUITE)
    if s.empty:
        return ""
    parts = []
    for d in view.deployments:
        rows = s[(s.deployment == d) & (s.category == "all")]
        n = rows[rows.metric == "accuracy"].n
        total = int(n.iloc[0]) if len(n) and n.iloc[0] == n.iloc[0] else None
        other = rows[rows.metric.isin(list(METHODS))]
        said = [f"{int(v)} {METHODS[m]}" for m, v in zip(other.metric, other.value)]
        rest = (total - int(other.value.sum())) if total is not None else None
        if rest:
            said.insert(0, f"{rest} one-pass (whole distribution at the letters' ids)")
        parts.append(f"{d}: {', '.join(said) or 'one-pass'}")
    return "How the letters were read: " + "; ".join(parts) + "."


def section(view: RunView) -> Section:
    flipped = flipped_items(view, SUITE, ("reference_pred", "output", "gold"))
    label = mmlu_label(view)
    intro = " ".join(x for x in ("" if label == "MMLU" else "evalkit's built-in multiple-choice set, not MMLU.",
                                 methods_note(view)) if x)
    return Section(SUITE, f"{label}: multiple choice", intro,
                   [mmlu_subject_table(view), flips_table(view, SUITE, "all", "questions")],
                   some(mmlu_plot(view)), details=[flipped] if not flipped.empty else [])


def verdict_columns(view: RunView) -> list[Column]:
    if not view.has(SUITE):
        return []
    label = mmlu_label(view)
    return [Column(label, "accuracy", lambda d: view.cell(d, SUITE, "all", "accuracy")),
            Column(label, "flips", lambda d: flips_cell(view, d, SUITE, "all"))]
