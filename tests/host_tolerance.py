"""How a score table written on one host is compared with one computed on another (issue 30).

Which promise holds, per figure (evalkit.metrics.likelihood's docstring says why):

- Bit-identical on every host: counts, shares and accuracies, Wilson and McNemar intervals, BLEU/chrF, the cost
  medians, and the perplexity figures built from the recorded NLLs (nll_mean, ppl, bits_per_byte, the PPL ratio,
  their SEs and intervals): sums and means are math.fsum's correctly rounded sums followed by IEEE-exact
  elementwise steps (+ - * / sqrt), and PPL's exp is libm's (math.exp), which numpy's SIMD choice does not touch.
  Compared character for character.
- Equal within TOLERANCE, with identical verdicts: every figure that passes through numpy's float64 exp or log
  (KLD and its percentiles, the top-k bound and its bias, Δp = exp(-nll_dep) - exp(-nll_ref)). numpy computes
  them with its own AVX-512 code on AVX-512 machines and with libm on AVX2 ones; the two differ in the last bit.

TOLERANCE: |a - b| <= REL_TOL * |b| + ABS_TOL. Measured on tests/data/run-v0 and v1_run, re-scored under numpy's
AVX-512 paths and its AVX2 paths (tests/avx2_paths.py) and set beside their recordings: AVX-512 against AVX2 at
most 2.5e-14 relative (a KLD percentile of the top-k bound) and 8.9e-16 absolute; against the recordings at most
7.2e-14 relative (a z-test p-value of 1.5e-12, where the normal tail magnifies a last-bit change of z) and 1.1e-14
absolute (a PPL difference of 11.5). REL_TOL 1e-9 keeps a margin of 10^4 over that and still fails on any real
change of method (a changed percentile rule, SE or bound moves these figures by 1e-6 or more). ABS_TOL 1e-13
covers figures at or near zero (a Δp, or a CI end that crosses zero), whose error is set by the size of the
operands (probabilities <= 1: a few 1e-16 per token), not by their own.

The recorded fixtures were scored by older evalkit with numpy's pairwise sums, so against them the perplexity
figures that are bit-identical across hosts today may still differ from the recording in the last bit: those
comparisons use the tolerance too; everything outside the perplexity suite is compared exactly.
"""
from __future__ import annotations

import csv
import io
import math
from typing import Callable, Iterable

REL_TOL = 1e-9
ABS_TOL = 1e-13

# Metrics computed through numpy's float64 exp/log (from the records' per-token values): any KLD or Δp figure,
# whatever its prefix (kld_mean, kld_bound_bias, pos_kld by position, ...).
TRANSCENDENTAL_PARTS = ("kld", "delta_p")

FLOAT_COLUMNS = ("value", "ci_low", "ci_high", "reference_value", "diff", "p_value", "margin")


def via_numpy_transcendentals(row: dict[str, str]) -> bool:
    return row.get("suite") == "perplexity" and any(part in row.get("metric", "") for part in TRANSCENDENTAL_PARTS)


def perplexity_figure(row: dict[str, str]) -> bool:
    return row.get("suite") == "perplexity"


def close(a: str, b: str) -> bool:
    """Two CSV cells equal within TOLERANCE (numbers), or equal as text (empty, NaN, words)."""
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= REL_TOL * abs(y) + ABS_TOL


def table(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text.lstrip("\ufeff"))))


# Issue 31 replaced three interval methods, and re-scoring an earlier run applies the new ones, named in the
# comparison's `method`: Tango's score interval for pass/fail differences (McNemar's exact p and so `significant`
# unchanged), Hall's t interval for continuous ones, block-clustered intervals for perplexity's KLD and top-1
# agreement, and no interval below the size where none covers. Those rows'
# interval ends (and, where the interval decides it, `significant`) are the new method's; every other figure of
# the row must still be reproduced.
def replaced_interval_columns(new_row: dict[str, str]) -> tuple[str, ...]:
    method = new_row.get("method", "")
    if "Tango score interval" in method:
        return ("ci_low", "ci_high", "method")
    if any(k in method for k in ("Hall's skewness-corrected", "too few items for an interval", "block-clustered",
                                 "too few blocks for an interval")):
        return ("ci_low", "ci_high", "significant", "method")
    return ()


def mismatches(before: Iterable[dict[str, str]], after: Iterable[dict[str, str]], key: tuple[str, ...],
               tolerant: Callable[[dict[str, str]], bool], ignore: tuple[str, ...] = ()) -> list[str]:
    """Rows of `before` that `after` lacks or changed: every column of `before` but `ignore` (and the interval
    columns a replaced method re-derives, `replaced_interval_columns`) must be equal as text, except
    FLOAT_COLUMNS of rows where `tolerant(row)`, which must be `close`. Rows only in `after` are not reported
    (metrics declared since)."""
    found = {tuple(r[k] for k in key): r for r in after}
    out = []
    for old in before:
        new = found.get(tuple(old[k] for k in key))
        if new is None:
            out.append(f"{'/'.join(old[k] for k in key)}: missing")
            continue
        for col, v in old.items():
            if col in ignore or col in replaced_interval_columns(new):
                continue
            w = new.get(col)
            ok = w is not None and (close(v, w) if col in FLOAT_COLUMNS and tolerant(old) else v == w)
            if not ok:
                out.append(f"{'/'.join(old[k] for k in key)} {col}: {v} -> {w}")
    return out
