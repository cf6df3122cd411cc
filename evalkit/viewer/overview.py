"""A run's decision and verdict as the report shows them, as JSON tables of text cells.

The tables are the report's own (evalkit.report.decision_section, evalkit.report.verdict over a RunView of
`evalkit.load_run`); the browser shows each cell's text with textContent, never as HTML.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.report.cells import Cell, Table
from evalkit.results import Run


def _cell(c: Cell) -> dict[str, Any]:
    return {"value": c.value, "interval": c.interval, "delta": c.delta, "delta_ci": c.delta_ci, "mark": c.mark,
            "symbol": c.symbol, "note": c.note}


def table_json(t: Table) -> dict[str, Any]:
    return {"key": t.key, "title": t.title, "header": t.header, "caption": t.caption,
            "rows": [[_cell(c) for c in row] for row in t.rows]}


def overview(path: Path) -> dict[str, Any]:
    from evalkit.report.decision_section import decision_parts
    from evalkit.report.verdict import how_sure, verdict
    from evalkit.report.view import RunView

    run = Run(path)
    out: dict[str, Any] = {"run_id": run.run_id, "reference": run.reference, "deployments": run.deployments,
                           "created": run.manifest.get("created"), "config_file": run.manifest.get("config_file"),
                           "decision": None, "verdict": None, "sureness": [], "errors": []}
    try:
        parts = decision_parts(run.decision)
        if parts is not None:
            out["decision"] = {"summary": parts["summary"], "rule": parts["rule"], "test": parts["test"],
                               "what_would_change": parts["what_would_change"],
                               "tables": [table_json(t) for t in parts["tables"]]}
    except Exception as e:  # a run without a readable decision still has items to show
        out["errors"].append(f"decision: {type(e).__name__}: {e}")
    try:
        view = RunView(run)
        if not run.scores.empty:
            table = verdict(view)
            out["verdict"] = table_json(table)
            out["sureness"] = [{"deployment": s.deployment, "text": s.text} for s in how_sure(view, table)]
    except Exception as e:  # a run without a readable verdict still has items to show
        out["errors"].append(f"verdict: {type(e).__name__}: {e}")
    return out
