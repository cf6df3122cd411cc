"""evalkit: is a quantized LLM deployment good enough, and how does it compare with another?"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_history", "load_run"]


def load_run(path: Any) -> Any:
    """Open a finished (or partial) run directory; DataFrame accessors: scores, items, comparisons, ..."""
    from evalkit.results import Run

    return Run(path)


def load_history(reports_dir: Any) -> Any:
    """Every run of a reports folder as one tidy DataFrame of scores, each row with what its result depends on
    and what changed since the deployment's previous run (evalkit.history)."""
    from evalkit.history import load_history as _load

    return _load(reports_dir)
