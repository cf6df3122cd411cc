"""Blind rating in the browser, stored as the very sheets `rate export` makes and `rate import` reads.

Each reviewer (a rater id) gets a sheet of their own, made by `evalkit.rating.export.browser_sheet` (same
columns, labels, per-item shuffles and key entry as an exported sheet) under `ratings/browser/`. A rating
sets the row's score and comment in that CSV and imports the sheet with `import_sheets` (validation and the
stored `ratings/imported/<rater>.absolute.json` are rate import's own), so browser and spreadsheet ratings
mix and enter scores.csv the same way at the next `evalkit report`. Concurrent reviewers write different
files; one reviewer in two tabs is serialised by the sheet's file lock, so no rating is lost.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

from filelock import FileLock

from evalkit.errors import RatingSheetError
from evalkit.rating.export import SCORE_MAX, SCORE_MIN, Mode, browser_sheet, write_csv
from evalkit.rating.import_ import import_sheets
from evalkit.resources import resource_path
from evalkit.spreadsheet import unneutralize
from evalkit.store import atomic_write_bytes, lock_path

RATER_ID = re.compile(r"^\w[\w.@-]{0,63}$")  # rate import's rule: the id becomes a file name
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MODE: Mode = "absolute"


class ReviewError(ValueError):
    """A review request that cannot be honoured (bad rater id, score, row); shown to the reviewer."""


def check_rater(rater_id: str) -> str:
    if not isinstance(rater_id, str) or not RATER_ID.match(rater_id):
        raise ReviewError("reviewer name: 1-64 letters, digits and . _ - @ (no spaces), starting with a letter or digit")
    return rater_id


def _read(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        return list(csv.reader(f))


def _rubric_text(category: str) -> str:
    try:
        return (Path(resource_path("rubrics")) / f"{category}.md").read_text(encoding="utf-8")
    except OSError:
        return ""


def sheet_view(run_dir: Path, rater_id: str) -> dict[str, Any]:
    """The reviewer's sheet (made on first use) as items, each with its outputs labelled A, B, ... in the
    sheet's shuffled order, the rubric, and what this reviewer already entered."""
    path = browser_sheet(run_dir, check_rater(rater_id), MODE)
    table = _read(path)
    head = table[0]
    col = {name: i for i, name in enumerate(head)}
    items: list[dict[str, Any]] = []
    by_item: dict[str, dict[str, Any]] = {}
    rubrics: dict[str, str] = {}
    for row in table[1:]:
        def get(name: str, row: list[str] = row) -> str:
            return unneutralize(row[col[name]]) if name in col and col[name] < len(row) else ""

        item_id = get("item_id")
        item = by_item.get(item_id)
        if item is None:
            category = get("category")
            if category not in rubrics:
                rubrics[category] = _rubric_text(category)
            item = by_item[item_id] = {"item_id": item_id, "category": category, "prompt": get("prompt"),
                                       "reference": get("reference"), "rubric": get("rubric"), "outputs": []}
            items.append(item)
        score = get("score")
        item["outputs"].append({"row_id": get("row_id"), "letter": LETTERS[len(item["outputs"]) % len(LETTERS)],
                                "output": get("output"), "score": int(score) if score.isdigit() else None,
                                "comment": get("comment")})
    return {"rater_id": rater_id, "sheet": f"ratings/browser/{path.name}", "items": items, "rubrics": rubrics,
            "score_min": SCORE_MIN, "score_max": SCORE_MAX}


def rate(run_dir: Path, rater_id: str, row_id: str, score: Any, comment: str = "") -> dict[str, Any]:
    """Set one row's score (and comment) in the reviewer's sheet and import the sheet."""
    check_rater(rater_id)
    if isinstance(score, bool) or not isinstance(score, int) or not SCORE_MIN <= score <= SCORE_MAX:
        raise ReviewError(f"score must be a whole number {SCORE_MIN}-{SCORE_MAX}")
    if not isinstance(comment, str) or len(comment) > 4000:
        raise ReviewError("comment: text of at most 4000 characters")
    path = browser_sheet(run_dir, rater_id, MODE)
    with FileLock(lock_path(path)):  # read-modify-write of this reviewer's sheet, one request at a time
        table = _read(path)
        head = table[0]
        rid, sc, cm = head.index("row_id"), head.index("score"), head.index("comment")
        for row in table[1:]:
            if row[rid] == row_id:
                row[sc], row[cm] = str(score), comment
                break
        else:
            raise ReviewError(f"no row {row_id!r} in this reviewer's sheet")
        before = path.read_bytes()
        write_csv(path, table)
        try:
            summary = import_sheets(Path(run_dir), [path])  # stores the sheet only; `evalkit report` scores it
        except RatingSheetError:
            atomic_write_bytes(path, before)  # the sheet stays as rate import last accepted it
            raise
    s = summary.sheets[0]
    return {"row_id": row_id, "score": score, "rated": s.rated, "rows": s.rows, "stored": str(Path(s.stored).name)}

