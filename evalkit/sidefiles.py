"""Side files: a record's per-token arrays as one binary `.npy` file named by the sha256 of its bytes.

Records (JSONL) keep scalars and the side file's hash; the arrays (a numpy structured array, one row per
scored token) live in `<run>/arrays/<sha256>.npy`. Why `.npy` rather than Arrow or Parquet: numpy is already
the scoring's library (no new dependency), the header names every field and dtype, `np.load(mmap_mode="r")`
reads one file without copying it, and the bytes are fixed by the array, so equal arrays share one name.

Crash safety, with the records file's rule (a record counts once its newline is on disk): a side file is
written to a temporary name, fsynced, renamed to its hash and its directory fsynced before the line naming it
is appended (`store.RecordWriter.write_batch`). A side file without its line is an orphan nobody reads; the
re-run item writes the same bytes under the same name (or another name, if the engine's numbers moved). A
file whose bytes do not hash to its name (a torn copy on a filesystem without atomic rename) is rewritten
when met by a writer and refused by a reader, never read as data.
"""
from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evalkit.errors import RunDirError
from evalkit.fileio import atomic_write_bytes, pid_alive

ARRAYS_DIR = "arrays"  # <run>/arrays/<sha256>.npy, and <cache>/arrays/<sha256>.npy in the result cache
SUFFIX = ".npy"
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class SideFile:
    """The bytes of one side file and their sha256: what travels with a record until a writer stores it
    (a Ray task ships it to the driver with the record; the result cache keeps it under the same name)."""

    sha256: str
    data: bytes

    @classmethod
    def of(cls, array: np.ndarray) -> "SideFile":
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        data = buf.getvalue()
        return cls(hashlib.sha256(data).hexdigest(), data)

    def array(self) -> np.ndarray:
        return np.load(io.BytesIO(self.data), allow_pickle=False)


def side_path(root: Path, sha256: str) -> Path:
    """Where the side file `sha256` lives under `root` (a run directory or the cache directory)."""
    return Path(root) / ARRAYS_DIR / f"{sha256}{SUFFIX}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_intact(path: Path, sha256: str) -> bool:
    """The file exists and its bytes hash to its name."""
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == sha256
    except OSError:
        return False


def write_side_file(root: Path, side: SideFile) -> Path:
    """Store `side` under `root` durably (temp file, fsync, rename, fsync of the directory); a file already
    there with the right bytes is kept. Raises OSError (ENOSPC: the disk is full) with nothing half-named."""
    path = side_path(root, side.sha256)
    if path.is_file() and path.stat().st_size == len(side.data) and is_intact(path, side.sha256):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # The writer's pid in the name: a temporary left by a crashed writer is known as garbage (`sweep_temporaries`).
    atomic_write_bytes(path, side.data, tmp_prefix=f".{side.sha256[:16]}.{os.getpid()}.", tmp_suffix=TMP_SUFFIX)
    _fsync_dir(path.parent)
    return path


def sweep_temporaries(root: Path) -> int:
    """Remove temporaries that writers no longer alive left in `root`'s side-file directory (a crash mid-write);
    returns how many. A live writer's temporary (another shard of the run) is left alone."""
    removed = 0
    for tmp in (Path(root) / ARRAYS_DIR).glob(f".*{TMP_SUFFIX}"):
        parts = tmp.name.split(".")
        pid = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else None
        if pid == os.getpid() or (pid is not None and pid_alive(pid)):
            continue
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def read_side_file(root: Path, sha256: str, *, where: str = "records", verify: bool = False) -> np.ndarray:
    """The structured array of side file `sha256` under `root`, memory-mapped (read-only).

    `verify` re-hashes the bytes first (a reader that must not trust the filesystem). A missing or damaged
    file is a RunDirError naming it: a record never names a file that was not on disk before it."""
    path = side_path(root, sha256)
    if not path.is_file():
        raise RunDirError(where, f"side file {path} named by a record is missing (the run directory was edited or copied in part)")
    if verify and not is_intact(path, sha256):
        raise RunDirError(where, f"side file {path} does not match its sha256 (damaged)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise RunDirError(where, f"side file {path} is unreadable: {e}") from None
