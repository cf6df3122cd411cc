"""Token-level differences of an output from the reference's, for highlighting.

Outputs are compared as word/space/punctuation tokens of their text (records' token ids are per engine
tokenizer, so ids of two engines are not comparable; the text is). difflib's SequenceMatcher is the
standard library's longest-matching-block diff; autojunk is off so long outputs are not mis-aligned.
"""
from __future__ import annotations

import difflib
import re

_TOKEN = re.compile(r"\w+|\s+|[^\w\s]", re.UNICODE)

Segments = list[tuple[str, int]]  # (text, 1 when it differs from the reference, else 0)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def segments(text: str, reference: str | None) -> Segments:
    """`text` cut into runs that are the same as / differ from `reference` (None: nothing to compare)."""
    if reference is None or text == reference:
        return [(text, 0)] if text else []
    mine, theirs = tokens(text), tokens(reference)
    out: Segments = []
    matcher = difflib.SequenceMatcher(None, theirs, mine, autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if j1 == j2:
            continue
        piece, flag = "".join(mine[j1:j2]), int(tag != "equal")
        if out and out[-1][1] == flag:
            out[-1] = (out[-1][0] + piece, flag)
        else:
            out.append((piece, flag))
    return out


def first_difference(a: list[int] | None, b: list[int] | None) -> int | None:
    """Index of the first token id where two sequences differ (None when equal or unknown)."""
    if a is None or b is None:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
