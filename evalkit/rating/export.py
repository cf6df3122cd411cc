"""Blind rating sheets: one per rater, neutral labels, shuffled order; the key stays in the run directory.

A sheet never names a deployment. Each rater gets their own label permutation ("S1", "S2"...), item
order and (pairwise) A/B positions, drawn from a seed recorded in `<run>/ratings/key.json`. The key is
written before the sheets, so every sheet that exists on disk can be de-blinded on import.

Model output is untrusted: every cell that a spreadsheet could run as a formula is neutralized with a
leading apostrophe (OWASP "CSV Injection": cells must not begin with = + - @ TAB CR LF), and xlsx cells
are written as typed strings so nothing is ever evaluated.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from evalkit.errors import DataError, RatingSheetError, RunDirError
from filelock import FileLock

from evalkit.store import RunDir, atomic_write_bytes, atomic_write_text, lock_path
from evalkit.suites import rated_suite, suite_spec
from evalkit.spreadsheet import neutralize

Mode = Literal["absolute", "pairwise"]
Fmt = Literal["csv", "xlsx"]

RATINGS_DIR = "ratings"
SHEETS_DIR = "sheets"
KEY_FILE = "key.json"
KEY_VERSION = 1

SCORE_MIN, SCORE_MAX = 1, 5
CHOICES = ("A", "tie", "B")
_COMMON = ["sheet_id", "run_id", "rater_id", "row_id", "item_id", "category", "prompt", "reference"]
COLUMNS: dict[str, list[str]] = {
    "absolute": _COMMON + ["system", "output", "rubric", "score", "comment"],
    "pairwise": _COMMON + ["output_A", "output_B", "rubric", "choice", "comment"],
}

def ratings_dir(run_path: Path) -> Path:
    return Path(run_path) / RATINGS_DIR


def key_path(run_path: Path) -> Path:
    return ratings_dir(run_path) / KEY_FILE


def load_key(run_path: Path) -> dict[str, Any]:
    """The de-blinding key of a run; an empty key when no sheet was exported yet."""
    path = key_path(run_path)
    if not path.exists():
        return {"version": KEY_VERSION, "sheets": {}}
    try:
        key = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RunDirError(str(path), f"unreadable rating key: {e}") from None
    if not isinstance(key, dict) or not isinstance(key.get("sheets"), dict):
        raise RunDirError(str(path), "not an evalkit rating key (no 'sheets' mapping)")
    return key


def _deployment_names(manifest: dict[str, Any]) -> list[str]:
    return [d["name"] if isinstance(d, dict) else str(d) for d in manifest.get("deployments", [])]


def rubric_summary(category: str, rubrics_dir: Path | None = None) -> str:
    """The rubric a sheet shows for a category of the rated suite's outputs (its SuiteSpec.rubric)."""
    rated = rated_suite()
    rubric = suite_spec(rated).rubric if rated is not None else None
    return rubric(category, rubrics_dir) if rubric is not None else ""


def _prompt_items(run: RunDir, deployments: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """item_id -> deployment -> record of the rated suite (SuiteSpec.rated_outputs; only items with at least one
    output)."""
    rated = rated_suite()
    items: dict[str, dict[str, dict[str, Any]]] = {}
    for dep in deployments:
        for rec in run.records(dep):
            if rec.get("suite") == rated:
                items.setdefault(str(rec["item_id"]), {})[dep] = rec
    return dict(sorted(items.items()))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _output(rec: dict[str, Any]) -> str:
    """A records line's generated text: its `generation` (records.Generation, version 3), or the flat field of
    the layouts before."""
    generation = rec.get("generation")
    return _text(generation.get("output_text") if isinstance(generation, dict) else rec.get("output_text"))


def _item_meta(outs: dict[str, dict[str, Any]], reference: str) -> tuple[str, str, str]:
    """(category, prompt, reference text) of an item, taken from the reference's record when present."""
    rec = outs.get(reference) or next(iter(outs.values()))
    return _text(rec.get("category")), _text(rec.get("prompt")), _text(rec.get("reference"))


def _row_ids(n: int) -> list[str]:
    width = max(3, len(str(n)))
    return [f"R{i:0{width}d}" for i in range(1, n + 1)]  # a letter first: spreadsheets keep it as text


def _plan_absolute(rng: random.Random, items: dict[str, dict[str, dict[str, Any]]], deployments: list[str]):
    shuffled = deployments[:]
    rng.shuffle(shuffled)
    labels = {f"S{i}": dep for i, dep in enumerate(shuffled, 1)}
    label_of = {dep: label for label, dep in labels.items()}
    order = list(items)
    rng.shuffle(order)
    plan = []
    for item_id in order:
        outputs = [d for d in deployments if d in items[item_id]]
        rng.shuffle(outputs)  # position inside an item says nothing either
        plan += [{"item_id": item_id, "label": label_of[d], "deployment": d} for d in outputs]
    return labels, plan


def _plan_pairwise(rng: random.Random, items: dict[str, dict[str, dict[str, Any]]], deployments: list[str],
                   reference: str):
    plan = []
    for item_id, outs in items.items():
        if reference not in outs:
            continue
        for dep in deployments:
            if dep != reference and dep in outs:
                a, b = (dep, reference) if rng.random() < 0.5 else (reference, dep)
                plan.append({"item_id": item_id, "A": a, "B": b, "deployment": dep, "reference": reference})
    # Fully shuffled, not grouped by item: adjacent rows sharing one output would hint at the reference.
    rng.shuffle(plan)
    return {}, plan


def _sheet_id(run_id: str, mode: str, seed: int, rater: int | str, plan: list[dict[str, Any]]) -> str:
    """Deterministic per (run, mode, seed, rater, content): re-exporting the same thing gives the same id."""
    blob = json.dumps([run_id, mode, seed, rater, plan], sort_keys=True, ensure_ascii=False)
    return "sh-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]  # "sh-": never parsed as a number


def export_sheets(
    run_dir: Path,
    raters: int = 2,
    fmt: Fmt = "csv",
    mode: Mode = "absolute",
    seed: int = 0,
    *,
    rubrics_dir: Path | None = None,
) -> list[Path]:
    """Write one blind sheet per rater under `<run>/ratings/sheets/` and record the key; returns the sheets."""
    if raters < 1:
        raise RatingSheetError(str(run_dir), f"need at least one rater (got {raters})")
    if fmt not in ("csv", "xlsx") or mode not in COLUMNS:
        raise ValueError(f"unknown format/mode {fmt!r}/{mode!r}")
    run = RunDir.open(Path(run_dir))
    inputs = _rating_inputs(run, mode, rubrics_dir)

    key_path(run.path).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path(key_path(run.path))):  # browser reviewers add sheets to the same key concurrently
        key = load_key(run.path)
        key.update(version=KEY_VERSION, run_id=inputs.run_id, reference=inputs.reference)
        sheets: list[tuple[Path, list[list[str]]]] = []
        for rater in range(1, raters + 1):
            rater_id = f"rater-{rater}"
            path = run.path / RATINGS_DIR / SHEETS_DIR / f"{rater_id}.{mode}.{fmt}"
            sheet_id, entry, table = _sheet(inputs, mode, seed, rater, rater_id, path.name, fmt)
            key["sheets"][sheet_id] = entry
            sheets.append((path, table))

        # Key first: a sheet on disk without its key could never be de-blinded.
        atomic_write_text(key_path(run.path), json.dumps(key, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    for path, table in sheets:
        (write_csv if fmt == "csv" else _write_xlsx)(path, table)
    return [p for p, _ in sheets]


@dataclass(frozen=True)
class _RatingInputs:
    """What every sheet of a run is made from (`_rating_inputs`)."""

    run_id: str
    reference: str
    deployments: list[str]
    items: dict[str, dict[str, dict[str, Any]]]  # item id -> deployment -> its prompt-suite record
    meta: dict[str, tuple[str, str, str]]  # item id -> (category, prompt, reference output)
    rubric_for: dict[str, str]  # category -> the rubric's summary line


def _sheet(inputs: _RatingInputs, mode: str, seed: int, rater: int | str, rater_id: str, file_name: str, fmt: str
           ) -> tuple[str, dict[str, Any], list[list[str]]]:
    """One rater's blind plan: (sheet id, its key entry, the sheet's table). `rater` seeds the shuffles."""
    run_id, reference, deployments = inputs.run_id, inputs.reference, inputs.deployments
    items, meta, rubric_for = inputs.items, inputs.meta, inputs.rubric_for
    rng_seed = f"evalkit-rating|{run_id}|{mode}|{seed}|{rater}"
    rng = random.Random(rng_seed)  # str seeds hash with SHA-512: stable across processes and versions
    if mode == "absolute":
        labels, plan = _plan_absolute(rng, items, deployments)
    else:
        labels, plan = _plan_pairwise(rng, items, deployments, reference)
    sheet_id = _sheet_id(run_id, mode, seed, rater, plan)
    rows: dict[str, dict[str, Any]] = {}
    table = [COLUMNS[mode]]
    for row_id, entry in zip(_row_ids(len(plan)), plan):
        outs = items[entry["item_id"]]
        category, prompt, ref_text = meta[entry["item_id"]]
        rows[row_id] = {"category": category, **entry}
        common = [sheet_id, run_id, rater_id, row_id, entry["item_id"], category, prompt, ref_text]
        if mode == "absolute":
            body = [entry["label"], _output(outs[entry["deployment"]])]
        else:
            body = [_output(outs[entry["A"]]), _output(outs[entry["B"]])]
        table.append(common + body + [rubric_for[category], "", ""])
    key_entry = {
        "run_id": run_id, "mode": mode, "rater_id": rater_id, "rater_index": rater, "file": file_name,
        "format": fmt, "seed": seed, "rng_seed": rng_seed, "labels": labels, "rows": rows,
    }
    return sheet_id, key_entry, table


BROWSER_DIR = "browser"  # sheets of reviewers rating in `evalkit view`, one per rater id and mode


def _rating_inputs(run: RunDir, mode: Mode, rubrics_dir: Path | None) -> _RatingInputs:
    """What every sheet of a run is made from: run id, reference, deployments, prompt items with their
    outputs, per-item metadata and the rubric summary per category; refuses a run with nothing to rate."""
    manifest = run.manifest()
    run_id, reference = str(manifest["run_id"]), str(manifest["reference"])
    deployments = _deployment_names(manifest)
    items = _prompt_items(run, deployments)
    if not items:
        raise DataError(str(run.path), "no prompt-suite records to rate")
    if mode == "pairwise" and (reference not in deployments or len(deployments) < 2):
        raise DataError(str(run.path), "pairwise rating needs the reference and at least one other deployment")
    meta = {item_id: _item_meta(outs, reference) for item_id, outs in items.items()}
    rubric_for = {c: rubric_summary("pairwise" if mode == "pairwise" else c, rubrics_dir)
                  for c in sorted({m[0] for m in meta.values()})}
    return _RatingInputs(run_id, reference, deployments, items, meta, rubric_for)


def browser_sheet(run_dir: Path, rater_id: str, mode: Mode = "absolute", seed: int = 0, *,
                  rubrics_dir: Path | None = None) -> Path:
    """The CSV sheet a reviewer fills in `evalkit view`, made exactly as `export_sheets` makes one (same
    columns, blind labels, per-item shuffles, key entry), for the rater slot `browser:<rater_id>`; an existing
    sheet is returned as it is. `rate import` reads it like any exported sheet."""
    run = RunDir.open(Path(run_dir))
    path = run.path / RATINGS_DIR / BROWSER_DIR / f"{rater_id}.{mode}.csv"
    key_path(run.path).parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_path(key_path(run.path))):
        key = load_key(run.path)
        if path.exists() and any(e.get("file") == path.name and e.get("rater_index") == f"browser:{rater_id}"
                                 for e in key["sheets"].values()):
            return path
        inputs = _rating_inputs(run, mode, rubrics_dir)
        sheet_id, entry, table = _sheet(inputs, mode, seed, f"browser:{rater_id}", rater_id, path.name, "csv")
        key.update(version=KEY_VERSION, run_id=inputs.run_id, reference=inputs.reference)
        key["sheets"][sheet_id] = entry
        atomic_write_text(key_path(run.path), json.dumps(key, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        write_csv(path, table)
    return path


def write_csv(path: Path, table: list[list[str]]) -> None:
    buf = io.StringIO()
    # QUOTE_ALL keeps embedded newlines, commas and quotes inside their cell; CRLF rows as RFC 4180 asks.
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    writer.writerows([[neutralize(c) for c in row] for row in table])
    atomic_write_text(path, "\ufeff" + buf.getvalue())  # BOM: Excel then reads the file as UTF-8


def _write_xlsx(path: Path, table: list[list[str]]) -> None:
    from openpyxl import Workbook
    from openpyxl.styles import Alignment, Font
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.datavalidation import DataValidation

    wb = Workbook()
    ws = wb.active
    ws.title = "ratings"
    header = table[0]
    for r, row in enumerate(table, 1):
        for c, value in enumerate(row, 1):
            if value == "":
                continue  # leave empty cells truly empty (score/choice/comment to fill in)
            cell = ws.cell(row=r, column=c)
            cell.value = neutralize(value)
            cell.data_type = "s"  # openpyxl would infer "f" (formula) for "=..."; force a plain string
    wide = {"prompt", "reference", "output", "output_A", "output_B", "rubric", "comment"}
    for c, name in enumerate(header, 1):
        ws.column_dimensions[get_column_letter(c)].width = 60 if name in wide else 14
        if name in wide:
            for (cell,) in ws.iter_rows(min_row=2, min_col=c, max_col=c):
                cell.alignment = Alignment(wrap_text=True, vertical="top")
    for cell in ws[1]:
        cell.font = Font(bold=True)
    ws.freeze_panes = "A2"
    # Spreadsheet-side input checks (a convenience; import_ validates again whatever the program did).
    validations = {
        "score": DataValidation(type="whole", operator="between", formula1=str(SCORE_MIN), formula2=str(SCORE_MAX),
                                allow_blank=True, showErrorMessage=True,
                                error=f"Enter a whole number {SCORE_MIN}-{SCORE_MAX}"),
        "choice": DataValidation(type="list", formula1='"' + ",".join(CHOICES) + '"', allow_blank=True,
                                 showErrorMessage=True, error="Choose A, tie or B"),
    }
    for name, dv in validations.items():
        if name in header:
            col = get_column_letter(header.index(name) + 1)
            dv.add(f"{col}2:{col}{len(table)}")
            ws.add_data_validation(dv)
    buf = io.BytesIO()
    wb.save(buf)
    atomic_write_bytes(path, buf.getvalue())
