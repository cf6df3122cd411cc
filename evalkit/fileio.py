"""Crash-safe file primitives shared by the run directory, side files and variant builds; JSON-safe values."""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes, *, tmp_prefix: str | None = None, tmp_suffix: str = ".tmp") -> None:
    """Write via a temp file in the same directory, fsync, then rename: readers never see half a file.
    `tmp_prefix` names the temporary (default `.<name>.`), for writers that sweep their own leftovers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix or f".{path.name}.", suffix=tmp_suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def json_safe(x: Any) -> Any:
    """JSON has no NaN: a number that cannot be said is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
