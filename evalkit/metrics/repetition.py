"""Repetition of a generated continuation: seq-rep-n (Welleck et al., 2019) and distinct-n (Li et al., 2016).

Both are defined over any sequence of hashable units. evalkit feeds them whitespace-separated *words* of
the output text, not token ids: words are the same for every tokenizer, so a vLLM and a llama.cpp
deployment (or two models) are measured on the same footing. No library ships these two one-liners in
a form that takes plain sequences, hence they live here.
"""
from __future__ import annotations

import math
from typing import Hashable, Sequence


def words(text: str) -> list[str]:
    """The units repetition is measured on: whitespace-separated words, case kept."""
    return text.split()


def ngrams(units: Sequence[Hashable], n: int) -> list[tuple[Hashable, ...]]:
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n})")
    return [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]


def seq_rep_n(units: Sequence[Hashable], n: int) -> float:
    """1 - |unique n-grams| / |n-grams|: 0 = no n-gram repeats, towards 1 = a loop.

    NaN when the sequence is shorter than n (no n-grams: nothing to judge, not "no repetition").
    """
    grams = ngrams(units, n)
    if not grams:
        return math.nan
    return 1.0 - len(set(grams)) / len(grams)


def distinct_n(units: Sequence[Hashable], n: int) -> float:
    """|unique n-grams| / |n-grams| of one sequence (= 1 - seq_rep_n); NaN when shorter than n.

    Li et al. pool n-grams over a corpus of outputs; pass the concatenated n-gram source units if
    that is what you want (see `distinct_n_corpus`).
    """
    grams = ngrams(units, n)
    if not grams:
        return math.nan
    return len(set(grams)) / len(grams)


def distinct_n_corpus(sequences: Sequence[Sequence[Hashable]], n: int) -> float:
    """Corpus-level distinct-n: unique n-grams over all sequences / all n-grams (none cross a boundary)."""
    grams = [g for seq in sequences for g in ngrams(seq, n)]
    if not grams:
        return math.nan
    return len(set(grams)) / len(grams)
