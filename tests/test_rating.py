"""Blind rating sheets: export (blind, neutralized), import (all or nothing), aggregation and agreement."""
from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from evalkit.errors import RatingSheetError
from evalkit.metrics.agreement import agreement, alpha, reliability_matrix
from evalkit.rating import export_sheets, import_sheets
from evalkit.rating.aggregate import aggregate, ratings_frame
from evalkit.spreadsheet import FORMULA_TRIGGERS, neutralize, unneutralize
from evalkit.store import RunDir

REF, FP8, Q4 = "dep-ref-fp16", "dep-vllm-fp8", "dep-llama-q4"
DEPLOYMENTS = [REF, FP8, Q4]
RUN_ID = "20250101-120000"
CATEGORIES = ["code", "code", "reasoning", "reasoning", "translation", "translation", "qa", "qa"]
ITEMS = [f"{c}-{i:03d}" for i, c in enumerate(CATEGORIES)]
HOSTILE = [
    "=cmd|' /C calc'!A0",
    "+1",
    "-2",
    "@SUM(A1)",
    "line one\nline two, with a comma and \"quotes\"",
    "中文输出：你好，世界。",
    "\tstarts with a tab",
    "\r\nstarts with CR LF",
]
BASE = {REF: 5, FP8: 4, Q4: 3}


def make_run(root: Path, run_id: str = RUN_ID) -> Path:
    run = RunDir(root)
    run.write_manifest({"run_id": run_id, "reference": REF, "deployments": DEPLOYMENTS, "suites": ["prompts"]})
    for d_i, dep in enumerate(DEPLOYMENTS):
        with run.writer(dep) as w:
            w.write_batch([{"suite": "prompts", "item_id": item, "category": cat, "prompt": f"Question {i}?",
                            "output_text": HOSTILE[(i + d_i) % len(HOSTILE)],
                            "reference": "你好，世界。" if cat == "translation" else None}
                           for i, (item, cat) in enumerate(zip(ITEMS, CATEGORIES))])
            w.write_batch([{"suite": "perplexity", "item_id": "chunk-0", "nll": 1.0}])  # not rated
    return root


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run")


def key(run: Path) -> dict[str, Any]:
    return json.loads((run / "ratings" / "key.json").read_text(encoding="utf-8"))


def read_csv(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        return list(csv.reader(f))


def write_csv(path: Path, rows: list[list[str]], **kw: Any) -> Path:
    with path.open("w", encoding=kw.pop("encoding", "utf-8-sig"), newline="") as f:
        csv.writer(f, quoting=kw.pop("quoting", csv.QUOTE_ALL), **kw).writerows(rows)
    return path


def true_score(rater: int, item: str, dep: str) -> int:
    """What our fake raters answer: a per-deployment level, rater 2 a point harsher on odd items."""
    return BASE[dep] - (1 if rater == 2 and ITEMS.index(item) % 2 else 0)


def fill(run: Path, sheet: Path, out: Path, value: Callable[[dict[str, Any]], str] | None = None) -> Path:
    """Fill an absolute sheet as rater `rater-N` would (scores from true_score via the key)."""
    rows = read_csv(sheet)
    h = rows[0]
    entry = key(run)["sheets"][rows[1][h.index("sheet_id")]]
    for r in rows[1:]:
        planned = entry["rows"][r[h.index("row_id")]]
        r[h.index("score")] = value(planned) if value else str(
            true_score(entry["rater_index"], planned["item_id"], planned["deployment"]))
    return write_csv(out, rows)


def fill_pairwise(run: Path, sheet: Path, out: Path) -> Path:
    """Fill a pairwise sheet as our rater would: the reference beats Q4 everywhere; FP8 ties on the 2 code items
    and wins the other 6 (its choices in lower case: the import reads them either way)."""
    rows = read_csv(sheet)
    h = rows[0]
    entry = key(run)["sheets"][rows[1][0]]
    for r in rows[1:]:
        planned = entry["rows"][r[h.index("row_id")]]
        if planned["deployment"] == Q4:
            r[h.index("choice")] = "A" if planned["A"] == REF else "B"
        elif planned["item_id"].startswith("code"):
            r[h.index("choice")] = "Tie"
        else:
            r[h.index("choice")] = "a" if planned["A"] == FP8 else "b"
    return write_csv(out, rows)


def imported_state(run: Path) -> dict[str, bytes]:
    d = run / "ratings" / "imported"
    return {p.name: p.read_bytes() for p in sorted(d.glob("*"))} if d.exists() else {}


# ---------------------------------------------------------------- export


def test_neutralize_every_trigger_and_round_trip() -> None:
    for trigger in FORMULA_TRIGGERS:
        cell = neutralize(trigger + "x")
        assert not cell.startswith(FORMULA_TRIGGERS)
        if trigger == "\0":
            assert cell == "\ufffdx"  # NUL is replaced (xlsx cannot hold it), which also defuses it
        else:
            assert cell == "'" + trigger + "x" and unneutralize(cell) == trigger + "x"
    assert neutralize("plain text") == "plain text"
    assert neutralize("a\x07b") == "a\ufffdb"  # control characters xlsx cannot store
    assert unneutralize("'quoted on purpose") == "'quoted on purpose"
    assert len(neutralize("=" * 40000)) <= 32767


def test_export_csv_is_blind_neutralized_with_bom(run: Path) -> None:
    paths = export_sheets(run, raters=2, fmt="csv", seed=7)
    assert [p.name for p in paths] == ["rater-1.absolute.csv", "rater-2.absolute.csv"]
    k = key(run)
    assert k["run_id"] == RUN_ID and len(k["sheets"]) == 2
    orders, label_maps = [], []
    for p in paths:
        raw = p.read_bytes()
        assert raw.startswith(b"\xef\xbb\xbf")
        for dep in DEPLOYMENTS + ["fp16", "fp8", "q4", "llama", "vllm"]:
            assert dep.encode() not in raw, f"{dep} leaks into {p.name}"
        rows = read_csv(p)
        h = rows[0]
        assert h == ["sheet_id", "run_id", "rater_id", "row_id", "item_id", "category", "prompt", "reference",
                     "system", "output", "rubric", "score", "comment"]
        body = rows[1:]
        assert len(body) == len(ITEMS) * len(DEPLOYMENTS)
        for r in body:
            assert all(not c.startswith(FORMULA_TRIGGERS) for c in r)
            assert r[h.index("score")] == "" and r[h.index("rater_id")] == p.name.split(".")[0]
        outputs = {r[h.index("output")] for r in body}
        assert {"'=cmd|' /C calc'!A0", "'+1", "'-2", "'@SUM(A1)", "'\tstarts with a tab",
                "'\r\nstarts with CR LF", "中文输出：你好，世界。", HOSTILE[4]} <= outputs
        assert any(r[h.index("rubric")].startswith("Rate whether") for r in body)  # the Summary: line
        entry = k["sheets"][body[0][0]]
        # The key de-blinds every row: the label shown is the label of the deployment that wrote the output.
        for r in body:
            planned = entry["rows"][r[h.index("row_id")]]
            assert entry["labels"][r[h.index("system")]] == planned["deployment"]
            i = ITEMS.index(planned["item_id"])
            assert neutralize(HOSTILE[(i + DEPLOYMENTS.index(planned["deployment"])) % 8]) == r[h.index("output")]
        orders.append([(r[h.index("item_id")], entry["rows"][r[h.index("row_id")]]["deployment"]) for r in body])
        label_maps.append(entry["labels"])
    assert orders[0] != orders[1] or label_maps[0] != label_maps[1]
    assert sorted(orders[0]) == sorted(orders[1])
    # Same seed, same sheets (reproducible); key written atomically, no temp files left.
    before = [p.read_bytes() for p in paths]
    assert [p.read_bytes() for p in export_sheets(run, raters=2, seed=7)] == before
    assert not list((run / "ratings").rglob("*.tmp"))


def test_export_xlsx_never_holds_a_formula(run: Path) -> None:
    from openpyxl import load_workbook

    (path,) = export_sheets(run, raters=1, fmt="xlsx")
    with zipfile.ZipFile(path) as z:
        xml = b"".join(z.read(n) for n in z.namelist())
    assert b"<f>" not in xml and b"<f " not in xml
    for dep in DEPLOYMENTS:
        assert dep.encode() not in xml
    ws = load_workbook(path).active
    cells = [c for row in ws.iter_rows(min_row=2) for c in row if c.value is not None]
    assert all(c.data_type == "s" for c in cells)
    assert "'=cmd|' /C calc'!A0" in {c.value for c in cells}


def test_export_pairwise_positions_shuffled(run: Path) -> None:
    paths = export_sheets(run, raters=2, mode="pairwise", seed=3)
    k = key(run)
    for p in paths:
        rows = read_csv(p)
        h = rows[0]
        assert "output_A" in h and "choice" in h and "system" not in h
        assert len(rows) - 1 == len(ITEMS) * 2  # each non-reference deployment vs the reference
        entry = k["sheets"][rows[1][0]]
        planned = list(entry["rows"].values())
        assert {e["A"] for e in planned} == set(DEPLOYMENTS)  # the reference is sometimes A, sometimes B
        assert all(REF in (e["A"], e["B"]) for e in planned)
        assert all(d.encode() not in p.read_bytes() for d in DEPLOYMENTS)


# ---------------------------------------------------------------- import + aggregate


def test_import_and_aggregate_absolute(run: Path, tmp_path: Path) -> None:
    sheets = export_sheets(run, raters=2)
    filled = [fill(run, s, tmp_path / s.name) for s in sheets]
    summary = import_sheets(run, filled)
    assert [s.status for s in summary.sheets] == ["imported", "imported"]
    assert {s.rater_id for s in summary.sheets} == {"rater-1", "rater-2"}
    assert "imported 24/24" in str(summary)

    frame = ratings_frame(run)
    assert len(frame) == 2 * len(ITEMS) * len(DEPLOYMENTS)
    stored = json.loads((run / "ratings/imported/rater-1.absolute.json").read_text(encoding="utf-8"))
    assert len(stored["source_sha256"]) == 64 and stored["rows"][0]["sheet_id"] == stored["sheet_id"]

    tables = aggregate(run)
    absolute = tables["absolute"].set_index(["deployment", "category"])
    for dep in DEPLOYMENTS:
        for cat in ("code", "reasoning", "translation", "qa"):
            expected = [true_score(r, it, dep) for r in (1, 2) for it, c in zip(ITEMS, CATEGORIES) if c == cat]
            row = absolute.loc[(dep, cat)]
            assert row["mean"] == pytest.approx(np.mean(expected))
            assert (row["n_ratings"], row["n_items"], row["n_raters"]) == (4, 2, 2)
        overall = absolute.loc[(dep, "all")]
        assert overall["mean"] == pytest.approx(BASE[dep] - 0.25)
        # a handful of items: fewer than an interval needs (evalkit.metrics.stats.MIN_ITEMS_FOR_INTERVAL), so none is shown
        assert np.isnan(overall["ci_low"]) and np.isnan(overall["ci_high"]) and "too few items" in overall["method"]

    vs = tables["absolute_vs_reference"].set_index(["deployment", "category"])
    assert vs.loc[(Q4, "all"), "diff"] == pytest.approx(-2.0)  # rater harshness is the same for both sides
    assert vs.loc[(Q4, "all"), "n_items"] == len(ITEMS) and not vs.loc[(Q4, "all"), "significant"]  # too few items
    assert vs.loc[(FP8, "code"), "diff"] == pytest.approx(-1.0)

    # Alpha: the package through our wrapper equals a direct computation on the same matrix.
    agree = tables["agreement"].set_index(["mode", "category"])
    triples = [(r.rater_id, (r.item_id, r.deployment), r.score) for r in frame.itertuples()]
    matrix, raters, units = reliability_matrix(triples)
    assert matrix.shape == (2, len(ITEMS) * len(DEPLOYMENTS))
    assert agree.loc[("absolute", "all"), "alpha"] == pytest.approx(hand_ordinal_alpha(matrix))
    assert agree.loc[("absolute", "all"), "n_raters"] == 2
    assert agree.loc[("absolute", "code"), ["n_units", "n_items"]].tolist() == [6, 2]


def test_import_pairwise_win_rates(run: Path, tmp_path: Path) -> None:
    (sheet,) = export_sheets(run, raters=1, mode="pairwise")
    import_sheets(run, [fill_pairwise(run, sheet, tmp_path / "pw.csv")])
    pw = aggregate(run)["pairwise"].set_index(["deployment", "category"])
    assert pw.loc[(Q4, "all"), ["win_rate", "tie_rate", "loss_rate"]].tolist() == [0.0, 0.0, 1.0]
    assert pw.loc[(FP8, "all"), ["wins", "ties", "losses"]].tolist() == [6, 2, 0]
    assert pw.loc[(FP8, "all"), "net"] == pytest.approx(0.75)
    q4 = pw.loc[(Q4, "all")]
    assert 0 < q4["loss_low"] < 1 and q4["loss_high"] == pytest.approx(1.0)  # Wilson: not a [1, 1] interval
    assert pw.loc[(FP8, "code"), "tie_rate"] == 1.0


def test_reimport_is_idempotent_and_correction_replaces(run: Path, tmp_path: Path) -> None:
    (sheet,) = export_sheets(run, raters=1)
    filled = fill(run, sheet, tmp_path / "a.csv")
    import_sheets(run, [filled])
    state = imported_state(run)
    assert import_sheets(run, [filled]).sheets[0].status == "unchanged"
    assert imported_state(run) == state
    corrected = fill(run, sheet, tmp_path / "a.csv", value=lambda planned: "1")
    assert import_sheets(run, [corrected]).sheets[0].status == "replaced"
    assert list(imported_state(run)) == list(state)  # still one file for this rater
    assert set(ratings_frame(run)["score"]) == {1}


def test_resaved_sheet_variants_import_the_same(run: Path, tmp_path: Path) -> None:
    """What spreadsheets do on save: no BOM, other quoting/separator, 3 -> "3.0", apostrophes dropped,
    rows reordered, blank trailing rows."""
    (sheet,) = export_sheets(run, raters=1)
    reference_rows = ratings_of(run, fill(run, sheet, tmp_path / "plain.csv"))
    rows = read_csv(tmp_path / "plain.csv")
    h, body = rows[0], rows[1:]
    for r in body:
        r[h.index("score")] += ".0"
        r[:] = [unneutralize(c) for c in r]
    body.reverse()
    resaved = write_csv(tmp_path / "resaved.csv", [h] + body + [[""] * len(h)], encoding="utf-8",
                        quoting=csv.QUOTE_MINIMAL, delimiter=";")
    assert not resaved.read_bytes().startswith(b"\xef\xbb\xbf")
    assert ratings_of(run, resaved) == reference_rows


def test_unrated_rows_are_missing_not_errors(run: Path, tmp_path: Path) -> None:
    (sheet,) = export_sheets(run, raters=1)
    rows = read_csv(fill(run, sheet, tmp_path / "partial.csv"))
    for r in rows[1:3]:
        r[rows[0].index("score")] = ""
    summary = import_sheets(run, [write_csv(tmp_path / "partial.csv", rows)])
    assert (summary.sheets[0].rated, summary.sheets[0].rows) == (22, 24)
    assert len(ratings_frame(run)) == 22


def ratings_of(run: Path, sheet: Path) -> list[tuple[str, str, int]]:
    import_sheets(run, [sheet])
    f = ratings_frame(run)
    return sorted(zip(f["item_id"], f["deployment"], f["score"].astype(int)))


def test_xlsx_round_trip(run: Path, tmp_path: Path) -> None:
    from openpyxl import load_workbook

    (xlsx,) = export_sheets(run, raters=1, fmt="xlsx")
    (csv_sheet,) = export_sheets(run, raters=1, fmt="csv")  # same seed, same plan, same sheet id
    expected = ratings_of(run, fill(run, csv_sheet, tmp_path / "c.csv"))
    wb = load_workbook(xlsx)
    ws = wb.active
    h = [c.value for c in ws[1]]
    entry = key(run)["sheets"][ws.cell(2, 1).value]
    for i, row in enumerate(ws.iter_rows(min_row=2), start=2):
        planned = entry["rows"][row[h.index("row_id")].value]
        s = true_score(1, planned["item_id"], planned["deployment"])
        row[h.index("score")].value = [s, float(s), str(s)][i % 3]  # what spreadsheets and people type
    wb.save(tmp_path / "filled.xlsx")
    (run / "ratings" / "imported" / "rater-1.absolute.json").unlink()
    assert ratings_of(run, tmp_path / "filled.xlsx") == expected


# ---------------------------------------------------------------- rejected sheets


def _edit(row_no: int, column: str, value: str) -> Callable[[list[list[str]]], None]:
    def edit(rows: list[list[str]]) -> None:
        rows[row_no - 1][rows[0].index(column)] = value
    return edit


BAD_SHEETS: dict[str, tuple[Callable[[list[list[str]]], None], str]] = {
    "score out of range": (_edit(3, "score", "7"), "row 3: score '7' out of range 1-5"),
    "score not an integer": (_edit(4, "score", "3.5"), "row 4: score '3.5' is not a whole number"),
    "score not a number": (_edit(2, "score", "good"), "row 2: score 'good' is not a whole number"),
    "unknown row id": (_edit(5, "row_id", "R999"), "row 5: unknown row_id 'R999'"),
    "duplicated row": (lambda rows: rows.append(list(rows[3])), "duplicate row_id R003 (also row 4)"),
    "missing rater id": (_edit(6, "rater_id", ""), "row 6: missing rater_id"),
    "rater id as a path": (lambda rows: [r.__setitem__(2, "../evil") for r in rows[1:]], "rater_id '../evil'"),
    "two raters": (_edit(2, "rater_id", "someone-else"), "more than one rater_id"),
    "run id changed": (_edit(2, "run_id", "another-run"), "row 2: run_id 'another-run' is not this run"),
    "item id changed": (_edit(7, "item_id", "qa-999"), "row 7: item_id 'qa-999' does not belong"),
    "foreign sheet id": (lambda rows: [r.__setitem__(0, "sh-000000000000") for r in rows[1:]],
                         "sheet 'sh-000000000000' was not exported from run"),
    "nothing rated": (lambda rows: [r.__setitem__(rows[0].index("score"), "") for r in rows[1:]],
                      "no score filled in"),
}


@pytest.mark.parametrize("case", sorted(BAD_SHEETS))
def test_invalid_sheet_rejected_nothing_imported(run: Path, tmp_path: Path, case: str) -> None:
    sheets = export_sheets(run, raters=2)
    good = fill(run, sheets[1], tmp_path / "good.csv")
    import_sheets(run, [good])
    before = imported_state(run)
    rows = read_csv(fill(run, sheets[0], tmp_path / "bad.csv"))
    edit, message = BAD_SHEETS[case]
    edit(rows)
    bad = write_csv(tmp_path / "bad.csv", rows)
    other_good = fill(run, sheets[1], tmp_path / "good2.csv", value=lambda p: "2")
    with pytest.raises(RatingSheetError) as err:
        import_sheets(run, [other_good, bad])  # all or nothing: the good sheet is not taken either
    text = str(err.value)
    assert message in text and text.startswith(str(bad)) and "\n" not in text
    assert imported_state(run) == before


def test_many_problems_fit_on_one_line(run: Path, tmp_path: Path) -> None:
    (sheet,) = export_sheets(run, raters=1)
    rows = read_csv(fill(run, sheet, tmp_path / "bad.csv", value=lambda p: "9"))
    with pytest.raises(RatingSheetError) as err:
        import_sheets(run, [write_csv(tmp_path / "bad.csv", rows)])
    text = str(err.value)
    assert "24 problems: row 2: score '9' out of range 1-5;" in text and "... and 20 more" in text
    assert "\n" not in text and not imported_state(run)


def test_sheet_from_another_run_rejected(run: Path, tmp_path: Path) -> None:
    other = make_run(tmp_path / "other", run_id="20250202-000000")
    (foreign,) = export_sheets(other, raters=1)
    export_sheets(run, raters=1)
    with pytest.raises(RatingSheetError, match="not exported from run '20250101-120000'"):
        import_sheets(run, [fill(other, foreign, tmp_path / "foreign.csv")])
    assert not imported_state(run)


def test_invalid_pairwise_choice_and_not_a_sheet(run: Path, tmp_path: Path) -> None:
    (sheet,) = export_sheets(run, raters=1, mode="pairwise")
    rows = read_csv(sheet)
    rows[1][rows[0].index("choice")] = "C"
    with pytest.raises(RatingSheetError, match=r"row 2: choice 'C' is not one of A, tie, B"):
        import_sheets(run, [write_csv(tmp_path / "pw.csv", rows)])
    (tmp_path / "notes.csv").write_text("name,score\nx,3\n", encoding="utf-8")
    with pytest.raises(RatingSheetError, match="not an evalkit rating sheet"):
        import_sheets(run, [tmp_path / "notes.csv"])
    (tmp_path / "latin1.csv").write_bytes("sheet_id,é\n".encode("latin-1"))
    with pytest.raises(RatingSheetError, match="not UTF-8"):
        import_sheets(run, [tmp_path / "latin1.csv"])
    (tmp_path / "broken.xlsx").write_bytes(b"not a zip file")
    with pytest.raises(RatingSheetError, match="not a readable .xlsx"):
        import_sheets(run, [tmp_path / "broken.xlsx"])
    assert not imported_state(run)


def test_same_rater_id_on_two_sheets_of_one_export_rejected(run: Path, tmp_path: Path) -> None:
    s1, s2 = export_sheets(run, raters=2)
    import_sheets(run, [fill(run, s1, tmp_path / "1.csv")])
    rows = read_csv(fill(run, s2, tmp_path / "2.csv"))
    for r in rows[1:]:
        r[rows[0].index("rater_id")] = "rater-1"  # rater 2 typed rater 1's id
    with pytest.raises(RatingSheetError, match="already imported from sheet"):
        import_sheets(run, [write_csv(tmp_path / "2.csv", rows)])
    # A new export (other seed) for the same rater slot is a correction, not a clash; old sheets stay valid.
    (new_s1, _) = export_sheets(run, raters=2, seed=1)
    assert import_sheets(run, [fill(run, new_s1, tmp_path / "1b.csv")]).sheets[0].status == "replaced"
    assert len(key(run)["sheets"]) == 4


# ---------------------------------------------------------------- agreement


def hand_ordinal_alpha(matrix: np.ndarray) -> float:
    """Krippendorff's ordinal alpha from the coincidence matrix (Krippendorff 2011), without the package."""
    values = sorted({v for v in matrix.ravel() if not np.isnan(v)})
    idx = {v: i for i, v in enumerate(values)}
    o = np.zeros((len(values), len(values)))
    for column in matrix.T:
        vals = [v for v in column if not np.isnan(v)]
        if len(vals) < 2:
            continue
        for i, a in enumerate(vals):
            for j, b in enumerate(vals):
                if i != j:
                    o[idx[a], idx[b]] += 1 / (len(vals) - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    delta = np.zeros_like(o)
    for c in range(len(values)):
        for k in range(len(values)):
            lo, hi = min(c, k), max(c, k)
            delta[c, k] = (n_c[lo : hi + 1].sum() - (n_c[lo] + n_c[hi]) / 2) ** 2
    observed = (o * delta).sum() / n
    expected = (np.outer(n_c, n_c) * delta).sum() / (n * (n - 1))
    return 1 - observed / expected


def test_alpha_matches_hand_computation_and_published_example() -> None:
    nan = np.nan
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 observers x 12 units.
    published = np.array([
        [1, 2, 3, 3, 2, 1, 4, 1, 2, nan, nan, nan],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, nan, 3],
        [nan, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, nan],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, nan],
    ])
    assert hand_ordinal_alpha(published) == pytest.approx(0.815, abs=5e-4)
    assert alpha(published, "ordinal") == pytest.approx(hand_ordinal_alpha(published))
    tiny = np.array([[1, 2, 3, 4, 5], [1, 3, 3, 5, nan], [2, 2, 4, 4, 5]], dtype=float)
    assert alpha(tiny, "ordinal", value_domain=[1, 2, 3, 4, 5]) == pytest.approx(hand_ordinal_alpha(tiny))
    assert alpha(tiny[:1]) != alpha(tiny[:1])  # one rater: undefined (NaN), not a number that looks real
    assert np.isnan(alpha(np.array([[3, 3], [3, 3]], dtype=float)))
    a = agreement([("r1", "u1", 1), ("r2", "u1", 1), ("r1", "u2", 5), ("r2", "u2", 5), ("r1", "u3", 2)])
    assert (a.alpha, a.n_raters, a.n_units, a.n_pairable_units) == (1.0, 2, 3, 2)


def test_aggregate_without_ratings_is_empty(run: Path) -> None:
    tables = aggregate(run)
    assert set(tables) == {"absolute", "absolute_vs_reference", "pairwise", "agreement"}
    assert all(t.empty for t in tables.values()) and "mean" in tables["absolute"].columns
