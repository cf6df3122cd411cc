"""Import filled rating sheets: validate every row first, then store all of a sheet or none of it.

Sheets come back from people and spreadsheets, so reading is lenient about form (BOM or not, any
quoting, "3" / "3.0" / 3, rows reordered, the anti-formula apostrophe kept or dropped) and strict about
substance (ids must match the key of this run, scores in range, one rater per sheet). The sheet's own
text columns are never trusted: item, category and deployment come from the key.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from evalkit.errors import RatingSheetError
from evalkit.rating.export import (
    CHOICES, RATINGS_DIR, SCORE_MAX, SCORE_MIN, load_key,
)
from evalkit.spreadsheet import unneutralize
from evalkit.store import RunDir, atomic_write_text

IMPORTED_DIR = "imported"
SHOWN_PROBLEMS = 4  # the error stays one readable line; the count says how many more there are
_RATER_ID = re.compile(r"^\w[\w.@-]{0,63}$")  # becomes a file name: no separators, no leading dot
_INTEGER = re.compile(r"^[+-]?\d+(?:[.,]0*)?$")  # "3", "3.0", "3,0" (comma-decimal locales)
_REQUIRED = ["sheet_id", "run_id", "rater_id", "row_id", "item_id"]


@dataclass(frozen=True)
class SheetImport:
    """What happened to one sheet: status is "imported", "replaced" or "unchanged"."""

    path: Path
    sheet_id: str
    rater_id: str
    mode: str
    rows: int
    rated: int
    status: str
    stored: Path


@dataclass(frozen=True)
class ImportSummary:
    sheets: tuple[SheetImport, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return "\n".join(
            f"{s.path.name}: {s.status} {s.rated}/{s.rows} rated rows from {s.rater_id} ({s.mode}) -> {s.stored}"
            for s in self.sheets
        )


@dataclass
class _Parsed:
    path: Path
    sheet_id: str
    rater_id: str
    mode: str
    rows: list[dict[str, Any]]
    n_rows: int


def imported_dir(run_path: Path) -> Path:
    return Path(run_path) / RATINGS_DIR / IMPORTED_DIR


def import_sheets(run_dir: Path, paths: list[Path]) -> ImportSummary:
    """Validate every sheet, then store each as `<run>/ratings/imported/<rater_id>.<mode>.json`.

    All or nothing: if any sheet has a problem, RatingSheetError names it and nothing is written.
    Only the sheets are stored: scores.csv and comparisons.csv are the scoring's (`rate import` then calls
    `evalkit.rating.aggregate.refresh_tidy_tables`, and `evalkit report` re-scores with the ratings).
    """
    run = RunDir.open(Path(run_dir))
    run_id = str(run.manifest()["run_id"])
    key = load_key(run.path)
    parsed = [_parse(Path(p), key, run_id) for p in paths]
    seen: dict[tuple[str, str], Path] = {}
    for p in parsed:
        other = seen.setdefault((p.rater_id, p.mode), p.path)
        if other != p.path:
            raise RatingSheetError(str(p.path), f"rater {p.rater_id!r} also rated {other.name} in this import "
                                               f"({p.mode}); give each rater a distinct rater_id")
        _check_clash(run.path, p, key)
    return ImportSummary(tuple(_store(run.path, run_id, p) for p in parsed))


def _check_clash(run_path: Path, p: _Parsed, key: dict[str, Any]) -> None:
    """Refuse a sheet that would overwrite what another rater's sheet stored under the same rater_id.

    A correction (same sheet, or the same rater's sheet from a re-export) replaces; a sheet made for
    another rater slot that reuses this rater_id would silently erase that rater's work.
    """
    stored = _stored_path(run_path, p.rater_id, p.mode)
    if not stored.exists():
        return
    previous = json.loads(stored.read_text(encoding="utf-8")).get("sheet_id")
    sheets = key["sheets"]
    if previous in sheets and sheets[previous]["rater_index"] != sheets[p.sheet_id]["rater_index"]:
        raise RatingSheetError(str(p.path), f"rater id {p.rater_id!r} was already imported from sheet {previous} "
                                            f"(made for another rater); give each rater a distinct rater_id")


def _stored_path(run_path: Path, rater_id: str, mode: str) -> Path:
    return imported_dir(run_path) / f"{rater_id}.{mode}.json"


def _store(run_path: Path, run_id: str, p: _Parsed) -> SheetImport:
    data = p.path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    for row in p.rows:
        row["source_sha256"] = sha
    payload = {
        "version": 1, "run_id": run_id, "rater_id": p.rater_id, "mode": p.mode, "sheet_id": p.sheet_id,
        "source_file": p.path.name, "source_sha256": sha,
        "rows": sorted(p.rows, key=lambda r: (r["item_id"], r["deployment"])),  # sheet order is meaningless
    }
    text = json.dumps(payload, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    out = _stored_path(run_path, p.rater_id, p.mode)
    if out.exists() and out.read_text(encoding="utf-8") == text:
        status = "unchanged"  # same sheet again: nothing to do (idempotent)
    else:
        status = "replaced" if out.exists() else "imported"
        atomic_write_text(out, text)
    rated = sum(1 for r in p.rows if r.get("score") is not None or r.get("choice") is not None)
    return SheetImport(p.path, p.sheet_id, p.rater_id, p.mode, p.n_rows, rated, status, out)


# ---------------------------------------------------------------- reading


def _read_table(path: Path) -> list[list[str]]:
    """Header + rows as text; cells normalized the same way whichever program saved the file."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise RatingSheetError(str(path), "file not found")
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".xlsx":
        return _read_xlsx(path)
    raise RatingSheetError(str(path), f"unsupported sheet format {suffix!r} (expected .csv or .xlsx)")


def _read_csv(path: Path) -> list[list[str]]:
    try:
        text = path.read_bytes().decode("utf-8-sig")  # with or without the BOM
    except UnicodeDecodeError:
        raise RatingSheetError(str(path), "not UTF-8 text; save it as 'CSV UTF-8' (or use the .xlsx sheet)") from None
    header = text.split("\n", 1)[0]
    # The header holds only plain column names, so the separator that splits it best is the one used.
    delimiter = max([",", ";", "\t"], key=lambda d: len(header.split(d)))
    try:
        return [[_cell(v) for v in row] for row in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)]
    except csv.Error as e:
        raise RatingSheetError(str(path), f"malformed CSV: {e}") from None


def _read_xlsx(path: Path) -> list[list[str]]:
    from zipfile import BadZipFile

    from openpyxl import load_workbook
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        wb = load_workbook(path, read_only=True, data_only=True)  # data_only: never a formula, only values
    except (BadZipFile, InvalidFileException, OSError, KeyError, ValueError) as e:
        raise RatingSheetError(str(path), f"not a readable .xlsx file ({e})") from None
    try:
        ws = wb["ratings"] if "ratings" in wb.sheetnames else wb.worksheets[0]
        return [[_cell(v) for v in row] for row in ws.iter_rows(values_only=True)]
    finally:
        wb.close()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # LibreOffice/Excel turn "3" into 3.0
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return unneutralize(str(value).strip())


# ---------------------------------------------------------------- validation


def _parse(path: Path, key: dict[str, Any], run_id: str) -> _Parsed:
    table = _read_table(path)
    header = [_header_name(h) for h in table[0]] if table else []
    col = {name: i for i, name in reversed(list(enumerate(header)))}  # first occurrence wins
    missing = [c for c in _REQUIRED if c not in col]
    if missing:
        raise RatingSheetError(str(path), f"not an evalkit rating sheet (missing column {', '.join(missing)})")

    def get(row: list[str], name: str) -> str:
        i = col.get(name)
        return row[i] if i is not None and i < len(row) else ""

    # Data rows keep their spreadsheet row number (header = row 1); blank rows are ignored.
    body = [(n, row) for n, row in enumerate(table[1:], start=2) if any(v for v in row)]
    if not body:
        raise RatingSheetError(str(path), "the sheet has no rows")
    sheet_counts = Counter(get(r, "sheet_id") for _, r in body if get(r, "sheet_id"))
    if not sheet_counts:
        raise RatingSheetError(str(path), "no sheet_id in any row")
    sheet_id = sheet_counts.most_common(1)[0][0]
    entry = key["sheets"].get(sheet_id)
    if entry is None or entry.get("run_id") != run_id:
        raise RatingSheetError(str(path), f"sheet {sheet_id!r} was not exported from run {run_id!r} "
                                          f"(not in ratings/key.json)")
    mode = entry["mode"]
    value_col = "score" if mode == "absolute" else "choice"
    if value_col not in col:
        raise RatingSheetError(str(path), f"{mode} sheet without a {value_col!r} column")

    problems: list[str] = []
    raters = Counter(get(r, "rater_id") for _, r in body if get(r, "rater_id"))
    first_row: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    for n, r in body:
        where = f"row {n}"
        if get(r, "sheet_id") != sheet_id:
            problems.append(f"{where}: sheet_id {get(r, 'sheet_id')!r} differs from {sheet_id!r}")
            continue
        if get(r, "run_id") != run_id:
            problems.append(f"{where}: run_id {get(r, 'run_id')!r} is not this run ({run_id!r})")
        rater_id = get(r, "rater_id")
        if not rater_id:
            problems.append(f"{where}: missing rater_id")
        elif not _RATER_ID.match(rater_id):
            problems.append(f"{where}: rater_id {rater_id!r} may only use letters, digits and . _ - @")
        row_id = get(r, "row_id")
        planned = entry["rows"].get(row_id)
        if planned is None:
            problems.append(f"{where}: unknown row_id {row_id!r}")
            continue
        if row_id in first_row:
            problems.append(f"{where}: duplicate row_id {row_id} (also row {first_row[row_id]})")
            continue
        first_row[row_id] = n
        if get(r, "item_id") != planned["item_id"]:
            problems.append(f"{where}: item_id {get(r, 'item_id')!r} does not belong to {row_id} "
                            f"(expected {planned['item_id']!r})")
        if mode == "absolute" and "system" in col and get(r, "system") != planned["label"]:
            problems.append(f"{where}: system {get(r, 'system')!r} does not belong to {row_id}")
        value, problem = (_score if mode == "absolute" else _choice)(get(r, value_col))
        if problem:
            problems.append(f"{where}: {problem}")
        rows.append(_normalized(planned, value, get(r, "comment"), rater_id, sheet_id, row_id, mode))
    if len(raters) > 1:
        problems.append(f"more than one rater_id in one sheet ({', '.join(sorted(raters))})")
    if not problems and not any(r[value_col] is not None for r in rows):
        problems.append(f"no {value_col} filled in")
    if problems:
        shown = "; ".join(problems[:SHOWN_PROBLEMS])
        more = f"; ... and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        noun = "problem" if len(problems) == 1 else "problems"
        raise RatingSheetError(str(path), f"{len(problems)} {noun}: {shown}{more}; nothing imported")
    return _Parsed(path, sheet_id, next(iter(raters)), mode, rows, len(body))


def _header_name(text: str) -> str:
    # A spreadsheet that read the file in the wrong charset keeps the BOM as "ï»¿" and its quotes literal.
    return text.strip().lstrip("\ufeff").removeprefix("ï»¿").strip('"').strip().lower()


def _score(text: str) -> tuple[int | None, str | None]:
    if text == "":
        return None, None  # not rated (yet): allowed, it is simply missing data
    if not _INTEGER.match(text):
        return None, f"score {text!r} is not a whole number {SCORE_MIN}-{SCORE_MAX}"
    value = int(re.split(r"[.,]", text)[0])
    if not SCORE_MIN <= value <= SCORE_MAX:
        return None, f"score {text!r} out of range {SCORE_MIN}-{SCORE_MAX}"
    return value, None


def _choice(text: str) -> tuple[str | None, str | None]:
    if text == "":
        return None, None
    by_lower = {c.lower(): c for c in CHOICES}
    if text.lower() not in by_lower:
        return None, f"choice {text!r} is not one of {', '.join(CHOICES)}"
    return by_lower[text.lower()], None


def _normalized(planned: dict[str, Any], value: Any, comment: str, rater_id: str, sheet_id: str, row_id: str,
                mode: str) -> dict[str, Any]:
    """One stored rating, de-blinded through the key (never through the sheet's text)."""
    row: dict[str, Any] = {
        "item_id": planned["item_id"], "deployment": planned["deployment"], "category": planned["category"],
        "comment": comment, "rater_id": rater_id, "sheet_id": sheet_id, "row_id": row_id,
    }
    if mode == "absolute":
        row["score"] = value
    else:
        preferred = None if value is None else "tie" if value == "tie" else planned[value]
        row.update(choice=value, reference=planned["reference"], preferred=preferred,
                   outcome=None if preferred is None else
                   "tie" if preferred == "tie" else "win" if preferred == planned["deployment"] else "loss")
    return row
