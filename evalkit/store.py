"""The run directory: manifest, append-only records, scores. Crash-safe by construction.

Records are JSON lines appended and fsynced per batch. A process killed mid-write leaves at most one
torn last line: any bytes after the last newline, even a complete JSON object whose newline never made it.
Readers (and so `done_keys`, which decides what a resume re-runs) count only newline-terminated lines, and
writers cut the unterminated tail off before appending: both see the file exactly as the writer will leave
it, so resume never loses or duplicates a finished item. Appends take the records file's lock (`filelock`),
so several processes may append to one file; a complete line that is not JSON is corruption, not a tear,
and is reported with its line number.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from filelock import FileLock, Timeout

from evalkit.errors import RunDirError
from evalkit.fileio import atomic_write_bytes
from evalkit.sidefiles import SideFile, sweep_temporaries, write_side_file

SIDE_KEY = "side_file"  # a record dict's in-memory side file (evalkit.sidefiles.SideFile); never written to JSON

MANIFEST = "manifest.json"
RECORDS_DIR = "records"
# The tidy tables scoring writes (and the rating import refreshes), and the per-item tables' folder.
SCORES_CSV = "scores.csv"
COMPARISONS_CSV = "comparisons.csv"
ITEMS_DIR = "items"
RUN_LOCK = ".evalkit.lock"


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


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def complete_part(data: bytes) -> bytes:
    """The newline-terminated prefix of a records file: what survives a writer's tail repair."""
    return data[: data.rfind(b"\n") + 1]


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of `path`: its newline-terminated lines, read one at a time (a file of any size streams).
    Bytes after the last newline are a torn write (a writer cuts them before appending) and are ignored, even
    when they parse as JSON."""
    for n, raw in _lines(path):
        yield json_line(path, n, raw)


def json_line(path: Path, n: int, raw: bytes) -> dict[str, Any]:
    """Line `n` of the records file `path` as its JSON object; RunDirError naming the line otherwise."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as e:
        # Writers append whole lines under a lock and repair a tear first: this is not a crash's trace.
        raise RunDirError(f"{path}:{n}", f"corrupt record (not JSON: {e.msg}); the records file was edited or damaged") from None
    if not isinstance(record, dict):
        raise RunDirError(f"{path}:{n}", "corrupt record (not a JSON object)")
    return record


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of every complete, non-blank line of `path`."""
    if not path.exists():
        return
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                return  # the torn tail
            if raw.strip():
                yield n, raw


# The head every evalkit writer gives a line (records.dump_record: schema_version, suite, item_id first):
# enough to know which item a line records without parsing the rest of it.
_HEAD = re.compile(rb'^\{"schema_version":(\d+),"suite":"((?:[^"\\]|\\.)*)","item_id":"((?:[^"\\]|\\.)*)"[,}]')


def line_head(raw: bytes) -> tuple[int, str, str] | None:
    """(schema_version, suite, item_id) from an evalkit-written line's head alone; None for another layout."""
    m = _HEAD.match(raw)
    if m is None:
        return None
    suite, item = (json.loads(b'"' + g + b'"') if b"\\" in g else g.decode() for g in m.groups()[1:])  # escapes: rare
    return int(m.group(1)), suite, item


def read_keys(path: Path) -> Iterator[str]:
    """`record_key` of every complete line of `path`, from the line's head alone (a line of another layout:
    parsed whole)."""
    for n, raw in _lines(path):
        head = line_head(raw)
        if head is not None:
            _, suite, item = head
        else:
            try:
                record = json.loads(raw)
                suite, item = record["suite"], record["item_id"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise RunDirError(f"{path}:{n}", "corrupt record (not a JSON object with suite and item_id)") from None
        yield record_key(suite, item)


def _last_newline_end(f: Any, size: int, block: int = 1 << 16) -> int:
    """Offset just past the last newline of the open file `f` of `size` bytes (0: none), read backwards."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


class RecordWriter:
    """Appends records to one JSONL file; each batch is one write, flushed and fsynced before returning.

    Every append holds the file's lock and first cuts a torn tail (a writer that died mid-batch), so
    concurrent writers (shards of one deployment, two resumes) never interleave or glue lines together."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(lock_path(path))
        self._file = path.open("ab", buffering=0)  # unbuffered: nothing of a failed write lingers to land later
        with self._lock:
            self._repair_torn_tail()
            sweep_temporaries(path.parent.parent)  # side-file temporaries of writers that died mid-write

    def _repair_torn_tail(self) -> None:
        """Cut everything after the last newline. Call with the lock held: then no live writer is mid-batch."""
        size = self.path.stat().st_size
        if size == 0:
            return
        with self.path.open("rb+") as f:
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            cut = _last_newline_end(f, size)  # keep every complete line, drop the torn one
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def write_batch(self, records: Iterable[dict[str, Any]]) -> None:
        """Append `records` as one write, fsynced. Side files the records carry (`SIDE_KEY`) are stored and
        fsynced first, next to the records directory: a line never names a file that is not on disk. A full
        disk is one RunDirError naming the file; what was complete stays complete."""
        lines = []
        sides: list[SideFile] = []
        for r in records:
            side = r.get(SIDE_KEY)
            if side is not None:
                sides.append(side)
                r = {k: v for k, v in r.items() if k != SIDE_KEY}
            lines.append(json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n")
        payload = b"".join(lines)
        if not payload:
            return
        try:
            for side in sides:
                write_side_file(self.path.parent.parent, side)
            with self._lock:
                self._repair_torn_tail()
                view = memoryview(payload)
                while view:  # O_APPEND: lands at the (repaired) end whoever wrote last
                    view = view[os.write(self._file.fileno(), view):]
                os.fsync(self._file.fileno())
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise RunDirError(str(self.path.parent.parent), f"no space left on the device while writing records "
                                  f"({e.strerror}); free space and finish with --resume") from None
            raise

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
        """A new, empty run directory named `run_id` (default: the UTC time to the second), else
        `<run_id>-2`, `-3`, ...: mkdir is atomic, so of two runs started in the same second in one
        `--out` each gets its own directory and neither fails."""
        base = run_id or datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for suffix in itertools.count(1):
            path = Path(out_dir) / (base if suffix == 1 else f"{base}-{suffix}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            (path / RECORDS_DIR).mkdir()
            return cls(path)
        raise AssertionError("unreachable")

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

    def record_lines(self, deployment: str) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) of every complete line of one deployment's records, unparsed and in file order
        (duplicates included: `records` keeps the first)."""
        return _lines(self.records_path(deployment))

    def done_keys(self, deployment: str) -> set[str]:
        """Keys of the recorded items, read from each line's head (payloads are not parsed)."""
        return set(read_keys(self.records_path(deployment)))

    def writer(self, deployment: str) -> RecordWriter:
        return RecordWriter(self.records_path(deployment))

    @contextmanager
    def exclusive(self) -> Iterator["RunDir"]:
        """Held by the process running or resuming this run: a second one is refused at once (two
        resumes would run the same pending items twice)."""
        lock = FileLock(self.path / RUN_LOCK, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise RunDirError(str(self.path), "in use by another evalkit process (a run or resume of it is still going)") from None
        try:
            yield self
        finally:
            lock.release()


def rows_to_csv(rows: Iterable[Any], columns: list[str]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(asdict(r) if hasattr(r, "__dataclass_fields__") else r)
    return buf.getvalue()
