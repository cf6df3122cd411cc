"""The run directory: manifest, append-only records, scores. Crash-safe by construction.

Records are JSON lines appended and fsynced per batch. A process killed mid-write leaves at most one
torn last line; readers ignore it and writers cut it off before appending, so resume never loses or
duplicates a finished item.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from evalkit.errors import RunDirError

MANIFEST = "manifest.json"
RECORDS_DIR = "records"


@dataclass(frozen=True)
class ScoreRow:
    """One number in scores.csv (tidy form)."""

    deployment: str
    suite: str
    category: str
    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class ComparisonRow:
    """A paired difference (deployment minus reference) on the same items, with its uncertainty."""

    deployment: str
    reference: str
    suite: str
    category: str
    metric: str
    value: float  # deployment's value
    reference_value: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n: int
    method: str
    significant: bool
    margin: float | None = None  # non-inferiority margin from config `decision.margins`, where one applies
    decision: str | None = None  # non-inferior | inferior | inconclusive (evalkit/decision.py)


SCORE_COLUMNS = [f.name for f in fields(ScoreRow)]
COMPARISON_COLUMNS = [f.name for f in fields(ComparisonRow)]


def record_key(suite: str, item_id: str) -> str:
    return f"{suite}/{item_id}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Complete JSON lines of `path`; a torn last line (no newline / bad JSON) is skipped."""
    if not path.exists():
        return
    with path.open("rb") as f:
        data = f.read()
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            yield json.loads(raw)
        except json.JSONDecodeError:
            continue  # only a torn tail can be malformed: writers only append whole lines


class RecordWriter:
    """Appends records to one JSONL file; each batch is flushed and fsynced before returning."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._file = path.open("ab")

    def _repair_torn_tail(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return
            cut = data.rfind(b"\n") + 1  # keep every complete line, drop the torn one
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def write_batch(self, records: Iterable[dict[str, Any]]) -> None:
        payload = b"".join(
            json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n" for r in records
        )
        if not payload:
            return
        self._file.write(payload)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunDir:
    """A run's directory: `manifest.json`, `records/<deployment>.jsonl`, scores and reports."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, out_dir: Path, run_id: str | None = None) -> "RunDir":
        run_id = run_id or datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        path = Path(out_dir) / run_id
        suffix = 1
        while path.exists():
            suffix += 1
            path = Path(out_dir) / f"{run_id}-{suffix}"
        (path / RECORDS_DIR).mkdir(parents=True)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> "RunDir":
        run = cls(Path(path))
        if not (run.path / MANIFEST).is_file():
            raise RunDirError(str(path), f"not an evalkit run directory (no {MANIFEST})")
        return run

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise RunDirError(str(self.manifest_path), f"unreadable manifest: {e}") from None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n")

    def records_path(self, deployment: str) -> Path:
        return self.path / RECORDS_DIR / f"{deployment}.jsonl"

    def records(self, deployment: str) -> list[dict[str, Any]]:
        """Finished records of one deployment; if an item appears twice the first one wins."""
        seen: dict[str, dict[str, Any]] = {}
        for rec in read_jsonl(self.records_path(deployment)):
            seen.setdefault(record_key(rec["suite"], rec["item_id"]), rec)
        return list(seen.values())

    def done_keys(self, deployment: str) -> set[str]:
        return {record_key(r["suite"], r["item_id"]) for r in read_jsonl(self.records_path(deployment))}

    def writer(self, deployment: str) -> RecordWriter:
        return RecordWriter(self.records_path(deployment))


def rows_to_csv(rows: Iterable[Any], columns: list[str]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(asdict(r) if hasattr(r, "__dataclass_fields__") else r)
    return buf.getvalue()
