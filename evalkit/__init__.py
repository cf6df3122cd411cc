"""evalkit: is a quantized LLM deployment good enough, and how does it compare with another?"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_run"]


def load_run(path):  # type: ignore[no-untyped-def]
    """Open a finished (or partial) run directory; DataFrame accessors: scores, items, comparisons, ..."""
    from evalkit.results import Run

    return Run(path)
