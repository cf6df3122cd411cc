"""The analyst notebooks run top to bottom against fixture runs, and say what the run files say.

Executed with nbclient on the "python3" kernel (this interpreter); the run paths reach the kernel through
EVALKIT_RUN / EVALKIT_RUNS, as they would for an analyst.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest

from fixtures_run import DEPLOYMENTS, FP8, Q4, REFERENCE, shared_runs

from conftest import require_module

require_module("nbclient", "runs the notebooks")
require_module("ipykernel", "runs the notebooks")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, env: dict[str, str], cwd: Path) -> nbformat.NotebookNode:
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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return shared_runs(tmp_path_factory, 2)


def test_explore_run(runs: list[Path], tmp_path: Path) -> None:
    run = runs[0]
    nb = execute("01_explore_run.ipynb", {"EVALKIT_RUN": str(run)}, tmp_path)
    no_errors(nb)
    assert f"Run('{run.name}'" in text(tagged(nb, "load"))

    comps = pd.read_csv(run / "comparisons.csv")
    mmlu = comps[(comps.suite == "mmlu") & (comps.category == "all")].set_index(["deployment", "metric"])
    flips = text(tagged(nb, "flips"))
    for dep in (FP8, Q4):
        n = int(mmlu.loc[(dep, "flip_rate"), "n"])
        r2w = round(mmlu.loc[(dep, "flips_right_to_wrong"), "value"] * n)
        w2r = round(mmlu.loc[(dep, "flips_wrong_to_right"), "value"] * n)
        assert f"{dep}: {r2w + w2r} MMLU flips ({r2w} right->wrong, {w2r} wrong->right)" in flips

    # The regressions the notebook finds are the items where the reference passed and the deployment failed.
    items = pd.read_csv(run / "items" / "prompts.csv", encoding="utf-8-sig")
    ok = items["pass"].fillna(items["contains"])
    verdict = dict(zip(zip(items.item_id, items.deployment), ok))
    expected = sorted(i for (i, d), v in verdict.items() if d == Q4 and v == 0 and verdict.get((i, REFERENCE)) == 1)
    assert expected and f"{Q4}: reference right, deployment wrong on {len(expected)} items: {', '.join(expected)}" in \
        text(tagged(nb, "regressions"))
    shown = text(tagged(nb, "side-by-side"))
    assert f"=== {expected[0]} ===" in shown and all(f"--- {d}:" in shown for d in DEPLOYMENTS)
    assert "<script>document.title='pwned'</script>" in shown  # printed as text, never rendered
    assert all(o.output_type == "stream" for o in tagged(nb, "side-by-side").outputs)


def test_compare_runs(runs: list[Path], tmp_path: Path) -> None:
    nb = execute("02_compare_runs.ipynb", {"EVALKIT_RUNS": str(runs[0].parent / "*")}, tmp_path)
    no_errors(nb)
    assert "2 runs from" in text(tagged(nb, "load"))
    n_scores = sum(len(pd.read_csv(r / "scores.csv")) for r in runs)
    assert text(tagged(nb, "concat")).startswith(f"{n_scores} score rows")

    # The pivot holds one row per run and the values scoring wrote for MMLU accuracy.
    pivot = text(tagged(nb, "pivot"))
    assert "mmlu/all/accuracy by run:" in pivot
    for r in runs:
        s = pd.read_csv(r / "scores.csv")
        acc = s[(s.suite == "mmlu") & (s.category == "all") & (s.metric == "accuracy")].set_index("deployment").value
        assert f"{acc[Q4]:.2f}" in pivot
    plot: list[Any] = [o for o in tagged(nb, "plot").outputs if "image/png" in o.get("data", {})]
    assert len(plot) == 1 and len(plot[0].data["image/png"]) > 1000
    assert "moved beyond them from" in text(tagged(nb, "moved"))
