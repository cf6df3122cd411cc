"""HumanEval in the report: pass@1, flipped tasks, verdict column.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

from evalkit.report.cells import Table
from evalkit.report.render import Section
from evalkit.report.tables import flipped_items, flips_table, metric_table
from evalkit.report.verdict import Column
from evalkit.report.view import RunView

SUITE = "humaneval"


def humaneval_table(view: RunView) -> Table:
    return metric_table(view, "humaneval-scores", "HumanEval pass@1", [("pass@1", "humaneval", "code", "pass@1")],
                        "Plain completion of each task prompt, run against its tests in the sandbox.")


def section(view: RunView) -> Section:
    flipped = flipped_items(view, SUITE, ("status", "detail"))
    return Section(SUITE, "HumanEval", "", [humaneval_table(view), flips_table(view, SUITE, "code", "tasks")],
                   details=[flipped] if not flipped.empty else [])


def verdict_columns(view: RunView) -> list[Column]:
    if not view.has(SUITE):
        return []
    return [Column("HumanEval", "pass@1", lambda d: view.cell(d, SUITE, "code", "pass@1"))]
