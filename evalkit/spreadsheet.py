"""What a spreadsheet cell may hold: model output in CSV/xlsx files must never run as a formula.

Shared by the per-item CSVs of scoring and the blind rating sheets, so both quote the same way.
"""
from __future__ import annotations

import re
from typing import Any

# OWASP CSV Injection (www-community, current text): no cell may begin with = + - @ TAB CR LF.
# ASVS 5.0 (1.2.10) adds NUL, which the control-character replacement below covers.
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\n", "\0")
EXCEL_CELL_LIMIT = 32767  # Excel and LibreOffice refuse or cut longer cells
_TRUNCATED = " …[truncated by evalkit]"
# Control characters that XML (xlsx) cannot hold and that confuse CSV readers; TAB/LF/CR are kept.
_ILLEGAL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def neutralize(text: str) -> str:
    """Cell text a spreadsheet shows as text: control characters replaced, formula triggers quoted."""
    text = _ILLEGAL_CHARS.sub("\ufffd", text)
    if len(text) > EXCEL_CELL_LIMIT:
        text = text[: EXCEL_CELL_LIMIT - len(_TRUNCATED) - 1] + _TRUNCATED
    return "'" + text if text.startswith(FORMULA_TRIGGERS) else text


def unneutralize(text: str) -> str:
    """Inverse of `neutralize`'s quoting: a re-saved sheet may keep or drop the apostrophe."""
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_TRIGGERS) else text


def neutralize_cell(value: Any) -> Any:
    """`neutralize` for text cells; numbers and other values pass through."""
    return neutralize(value) if isinstance(value, str) else value
