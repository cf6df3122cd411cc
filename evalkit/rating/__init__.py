"""Blind human rating: export sheets, import them back (all or nothing), aggregate with uncertainty.

Aggregation lives in `evalkit.rating.aggregate` (aggregate, ratings_frame) and is not re-exported here:
it pulls in pandas/scipy, which `rate export` / `rate import` should not pay for, and a package
attribute named like the submodule would be overwritten by it on import.
"""
from __future__ import annotations

from evalkit.rating.export import export_sheets
from evalkit.rating.import_ import ImportSummary, SheetImport, import_sheets

__all__ = ["ImportSummary", "SheetImport", "export_sheets", "import_sheets"]
