"""The analyst notebooks run top to bottom against copies of the session's real run (conftest.rated_run, and
conftest.hostile_run a day later with markup in place of some outputs), and say what the run files say.

Executed with nbclient on the "python3" kernel (this interpreter); the run paths reach the kernel through
EVALKIT_RUN / EVALKIT_RUNS, as they would for an analyst.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pandas as pd
import pytest

from conftest import REAL_RUN_DEPLOYMENTS, REAL_RUN_REFERENCE, require_module
from real_run_copies import HOSTILE

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
DEP = next(d for d in REAL_RUN_DEPLOYMENTS if d != REAL_RUN_REFERENCE)


def execute(name: str, env: dict[str, str], cwd: Path) -> nbformat.NotebookNode:
    require_module("nbclient", "runs the notebooks")
    require_module("ipykernel", "runs the notebooks")
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def tagged(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    return cell


def text(cell: nbformat.NotebookNode) -> str:
    """Everything a cell printed or returned, as plain text."""
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(o.data.get("text/plain", ""))
    return "\n".join(out)


def no_errors(nb: nbformat.NotebookNode) -> None:
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.get("execution_count"), f"cell did not run: {c.source[:60]}"
            assert not [o for o in c.get("outputs", []) if o.output_type == "error"], c.source[:60]


def mmlu_right(run: Path, dep: str) -> dict[str, bool]:
    """Per question, whether the highest-log-prob letter is the gold one (from the JSONL records)."""
    recs = [json.loads(x) for x in (run / "records" / f"{dep}.jsonl").read_text(encoding="utf-8").splitlines()]
    return {r["item_id"]: "ABCD"[int(np.argmax(r["choice_logprobs"]))] == r["gold"] for r in recs if r["suite"] == "mmlu"}


pytestmark = pytest.mark.engine  # the runs are copies of the session's real llama.cpp run


def test_explore_run(hostile_run: Path, tmp_path: Path) -> None:
    run = hostile_run
    nb = execute("01_explore_run.ipynb", {"EVALKIT_RUN": str(run)}, tmp_path)
    no_errors(nb)
    assert f"Run('{run.name}'" in text(tagged(nb, "load"))

    ref, dep = mmlu_right(run, REAL_RUN_REFERENCE), mmlu_right(run, DEP)
    r2w, w2r = sum(ref[i] and not dep[i] for i in ref), sum(dep[i] and not ref[i] for i in ref)
    assert f"{DEP}: {r2w + w2r} MMLU flips ({r2w} right->wrong, {w2r} wrong->right)" in text(tagged(nb, "flips"))

    # The regressions the notebook finds are the items where the reference passed and the deployment failed.
    items = pd.read_csv(run / "items" / "prompts.csv", encoding="utf-8-sig")
    ok = items["pass"].fillna(items["contains"])
    verdict = dict(zip(zip(items.item_id, items.deployment), ok))
    expected = sorted(i for (i, d), v in verdict.items() if d == DEP and v == 0 and verdict.get((i, REAL_RUN_REFERENCE)) == 1)
    assert any(i.startswith("qa-") for i in expected)  # its QA answers are markup now: wrong wherever the reference was right
    assert f"{DEP}: reference right, deployment wrong on {len(expected)} items: {', '.join(expected)}" in \
        text(tagged(nb, "regressions"))
    shown = text(tagged(nb, "side-by-side"))
    assert all(f"--- {d}:" in shown for d in REAL_RUN_DEPLOYMENTS)
    assert HOSTILE[0] in shown  # printed as text, never rendered
    assert all(o.output_type == "stream" for o in tagged(nb, "side-by-side").outputs)


def test_compare_runs(rated_run: tuple[Path, list], hostile_run: Path, tmp_path: Path) -> None:
    runs = [rated_run[0], hostile_run]
    assert rated_run[0].parent == hostile_run.parent
    nb = execute("02_compare_runs.ipynb", {"EVALKIT_RUNS": str(hostile_run.parent / "*")}, tmp_path)
    no_errors(nb)
    assert "2 runs from" in text(tagged(nb, "load"))
    n_scores = sum(len(pd.read_csv(r / "scores.csv")) for r in runs)
    assert text(tagged(nb, "concat")).startswith(f"{n_scores} score rows")

    # The pivot holds one row per run and each run's MMLU accuracy, counted here from the records.
    pivot = text(tagged(nb, "pivot"))
    assert "mmlu/all/accuracy by run:" in pivot
    for r in runs:
        for d in REAL_RUN_DEPLOYMENTS:
            right = mmlu_right(r, d)
            assert f"{sum(right.values()) / len(right):.4f}".rstrip("0") in pivot
    plot: list[Any] = [o for o in tagged(nb, "plot").outputs if "image/png" in o.get("data", {})]
    assert len(plot) == 1 and len(plot[0].data["image/png"]) > 1000

    # Between the two runs only the hostile copy's QA answers changed: the scores that moved beyond both
    # intervals are the ones the notebook counts (from the two scores.csv files).
    keys = ["deployment", "suite", "category", "metric"]
    a, b = (pd.read_csv(r / "scores.csv").set_index(keys) for r in runs)
    both = a.merge(b, left_index=True, right_index=True, how="inner", suffixes=("_prev", "_last")).dropna(subset=["ci_low_last", "ci_low_prev"])
    moved = both[(both.ci_low_last > both.ci_high_prev) | (both.ci_high_last < both.ci_low_prev)]
    assert f"{len(moved)} of {len(both)} scores with intervals moved beyond them from {runs[0].name} to {runs[1].name}" in \
        text(tagged(nb, "moved"))
