"""Imported human ratings enter scores.csv / comparisons.csv as suite `ratings`, like any metric."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from evalkit.rating.export import export_sheets
from evalkit.rating.aggregate import refresh_tidy_tables
from evalkit.rating.import_ import import_sheets
from evalkit.store import RunDir
from test_rating import FP8, Q4, REF, fill_pairwise, key, make_run, read_csv, write_csv

HEADER = "deployment,suite,category,metric,value,ci_low,ci_high,n\n"
OTHER_ROW = "x,mmlu,all,accuracy,0.5,0.1,0.9,20\n"  # an existing row of another suite: must stay byte for byte


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _tiny_run(root: Path) -> Path:
    """One deployment (the reference), three prompts: three rated outputs per rater."""
    run = RunDir(root)
    run.write_manifest({"run_id": "20250101-000000", "reference": "ref", "deployments": ["ref"]})
    with run.writer("ref") as w:
        w.write_batch([{"suite": "prompts", "item_id": f"qa-{i}", "category": "qa", "prompt": f"Q{i}?",
                        "output_text": f"A{i}", "reference": None} for i in range(3)])
    (root / "scores.csv").write_text(HEADER + OTHER_ROW, encoding="utf-8")
    (root / "comparisons.csv").write_text(
        "deployment,reference,suite,category,metric,value,reference_value,diff,ci_low,ci_high,p_value,n,method,significant\n",
        encoding="utf-8")
    return root


def test_absolute_ratings_rows_and_alpha_by_hand(tmp_path: Path) -> None:
    run = _tiny_run(tmp_path / "run")
    given = {1: {"qa-0": 1, "qa-1": 2, "qa-2": 3}, 2: {"qa-0": 1, "qa-1": 3, "qa-2": 3}}
    filled = []
    for sheet in export_sheets(run, raters=2):
        rows = read_csv(sheet)
        h = rows[0]
        entry = key(run)["sheets"][rows[1][h.index("sheet_id")]]
        for r in rows[1:]:
            planned = entry["rows"][r[h.index("row_id")]]
            r[h.index("score")] = str(given[entry["rater_index"]][planned["item_id"]])
        filled.append(write_csv(tmp_path / sheet.name, rows))
    import_sheets(run, filled)
    # Importing stores the sheets only; the tidy tables change when refreshed (`rate import` does so).
    assert (run / "scores.csv").read_text(encoding="utf-8") == HEADER + OTHER_ROW
    refresh_tidy_tables(run)

    text = (run / "scores.csv").read_text(encoding="utf-8")
    assert text.startswith(HEADER + OTHER_ROW)
    rows = {(r["deployment"], r["category"], r["metric"]): r for r in _rows(run / "scores.csv") if r["suite"] == "ratings"}
    # Mean of the six ratings: (1 + 2 + 3 + 1 + 3 + 3) / 6 = 13/6; n counts items.
    assert float(rows[("ref", "all", "rating")]["value"]) == pytest.approx(13 / 6)
    assert rows[("ref", "qa", "rating")]["n"] == "3"
    # Ordinal Krippendorff's alpha by hand. Values 1,1 | 2,3 | 3,3: n1 = 2, n2 = 1, n3 = 3, n = 6.
    # delta^2(c,k) = (sum_{g=c..k} n_g - (n_c + n_k)/2)^2: d12 = 1.5^2, d13 = 3.5^2, d23 = 2^2.
    # D_o = (o23 + o32) * 4 / 6 = 8/6; D_e = 2 * (2*1*2.25 + 2*3*12.25 + 1*3*4) / (6*5) = 6; alpha = 1 - (8/6)/6 = 7/9.
    assert float(rows[("all", "all", "krippendorff_alpha")]["value"]) == pytest.approx(7 / 9)
    assert rows[("all", "all", "krippendorff_alpha")]["n"] == "3"  # units rated by both raters

    # Re-importing the same sheets changes nothing; the other suite's row is untouched.
    import_sheets(run, filled)
    refresh_tidy_tables(run)
    assert (run / "scores.csv").read_text(encoding="utf-8") == text


def test_pairwise_win_tie_loss_and_differences_in_tidy_tables(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "scores.csv").write_text(HEADER, encoding="utf-8")
    (run / "comparisons.csv").write_text(
        "deployment,reference,suite,category,metric,value,reference_value,diff,ci_low,ci_high,p_value,n,method,significant\n",
        encoding="utf-8")
    (sheet,) = export_sheets(run, raters=1, mode="pairwise")
    import_sheets(run, [fill_pairwise(run, sheet, tmp_path / "pw.csv")])
    refresh_tidy_tables(run)
    scores = {(r["deployment"], r["category"], r["metric"]): float(r["value"])
              for r in _rows(run / "scores.csv") if r["suite"] == "ratings"}
    assert (scores[(Q4, "all", "win_rate")], scores[(Q4, "all", "loss_rate")]) == (0.0, 1.0)
    assert (scores[(FP8, "all", "win_rate")], scores[(FP8, "all", "tie_rate")]) == (0.75, 0.25)
    comps = {(r["deployment"], r["category"], r["metric"]): r for r in _rows(run / "comparisons.csv")}
    net = comps[(FP8, "all", "net_preference")]
    assert float(net["diff"]) == pytest.approx((6 * 1 + 2 * 0) / 8) and net["reference"] == REF
    q4 = comps[(Q4, "all", "net_preference")]
    # every item lost, but 8 items are too few for an interval (evalkit.metrics.stats.MIN_ITEMS_FOR_INTERVAL)
    assert float(q4["diff"]) == -1.0 and q4["significant"] == "False" and "too few items" in q4["method"]


def test_rate_import_verb_refreshes_the_tidy_tables(tmp_path: Path) -> None:
    """`rate import` stores the sheets and then refreshes the ratings rows (the import itself writes no score)."""
    from evalkit.cli import main

    run = _tiny_run(tmp_path / "run")
    (sheet,) = export_sheets(run, raters=1)
    rows = read_csv(sheet)
    h = rows[0]
    for r in rows[1:]:
        r[h.index("score")] = "4"
    assert main(["rate", "import", str(run), str(write_csv(tmp_path / sheet.name, rows))]) == 0
    got = {(r["deployment"], r["category"], r["metric"]): r for r in _rows(run / "scores.csv") if r["suite"] == "ratings"}
    assert float(got[("ref", "all", "rating")]["value"]) == 4.0 and got[("ref", "all", "rating")]["n"] == "3"
    assert (run / "scores.csv").read_text(encoding="utf-8").startswith(HEADER + OTHER_ROW)
