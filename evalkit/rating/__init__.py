"""Blind human rating: export sheets, import them back (all or nothing), aggregate with uncertainty."""
from __future__ import annotations

from importlib import import_module
from typing import Any

# Lazy: `rate export` should not pay for pandas/scipy, which only aggregation needs.
_EXPORTS = {
    "export_sheets": "evalkit.rating.export",
    "import_sheets": "evalkit.rating.import_",
    "ImportSummary": "evalkit.rating.import_",
    "SheetImport": "evalkit.rating.import_",
    "aggregate": "evalkit.rating.aggregate",
    "ratings_frame": "evalkit.rating.aggregate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'evalkit.rating' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
