"""Which run directories the viewer may read: direct children of the reports folder, by a plain name.

Names come from URLs, so a name is accepted only when it is a single path component of safe characters
(no `..`, no separators, no encoded slash survives to here), the directory is not a symlink, and its
resolved path is a direct child of the resolved reports folder. Anything else is "not found" (404).
"""
from __future__ import annotations

import re
from pathlib import Path

from evalkit.store import MANIFEST

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class NotFound(Exception):
    """A run or file the viewer will not show (missing, or outside the reports folder)."""


def run_path(root: Path, name: str) -> Path:
    """The run directory `name` under `root`, or NotFound."""
    if not RUN_NAME.match(name) or ".." in name:
        raise NotFound(name)
    candidate = root / name
    if candidate.is_symlink() or not candidate.is_dir():
        raise NotFound(name)
    real = candidate.resolve()
    if real.parent != root.resolve():
        raise NotFound(name)
    manifest = real / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        raise NotFound(name)
    return real


def inside(run_dir: Path, path: Path) -> bool:
    """Whether `path` (a file the viewer is about to read inside a run) really lies inside it."""
    try:
        return not path.is_symlink() and path.resolve().is_relative_to(run_dir.resolve())
    except OSError:
        return False


def run_names(root: Path) -> list[str]:
    """Every readable run directory under `root`, newest name first."""
    out = []
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    for child in children:
        try:
            run_path(root, child.name)
        except NotFound:
            continue
        out.append(child.name)
    return sorted(out, reverse=True)
