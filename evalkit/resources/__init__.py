"""Files shipped with evalkit: the default config, prompt set, rubrics and texts."""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def resource_path(relative: str) -> Path:
    """Path of a shipped resource (the repo's configs/, prompts/, rubrics/, texts/ are linked here)."""
    rel = relative.rstrip("/")
    if rel == "default.yaml":
        return _HERE / "configs" / "default.yaml"
    return _HERE / rel
