"""Table cells and number formats of the report: one value, its interval, its difference from the reference.

Values, intervals and significance come from what scoring wrote; this module only formats them.
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

import pandas as pd

from evalkit.metrics.declarations import metric_spec

log = logging.getLogger(__name__)

Mark = Literal["better", "worse", "changed", "same", "na"]
def marks(level: str = "95%") -> dict[str, tuple[str, str]]:
    """The marks' legend at the run's confidence level (config `stats.alpha`)."""
    return {k: (sym, text.replace("95%", level)) for k, (sym, text) in MARKS.items()}


MARKS: dict[str, tuple[str, str]] = {  # mark -> (symbol, legend)
    "better": ("▲", "better than the reference, distinguishable from noise (95%)"),
    "worse": ("▼", "worse than the reference, distinguishable from noise (95%)"),
    "changed": ("◆", "different from the reference, distinguishable from noise (95%)"),
    "same": ("≈", "not distinguishable from noise (the 95% interval of the difference includes 0)"),
    "na": ("○", "no interval (too few items to say)"),
}
MINUS = "\u2212"
CATEGORIES = ("code", "reasoning", "translation", "qa")
CATEGORY_LABEL = {"code": "code", "reasoning": "reasoning", "translation": "translation", "qa": "QA", "all": "all"}


# -- cells and tables --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One table cell: a value, its own interval, its difference from the reference (and that difference's
    interval) and a significance mark."""

    value: str
    interval: str = ""
    delta: str = ""  # e.g. "−7.0 pts"
    delta_ci: str = ""  # e.g. "[−15.0, −2.0]" or "no interval"
    mark: Mark | None = None
    note: str = ""  # shown on hover (HTML title): method, n, p
    raw: float | None = None  # |difference| / its uncertainty, ranks the "biggest" difference

    @property
    def symbol(self) -> str:
        return MARKS[self.mark][0] if self.mark else ""

    @property
    def diff(self) -> str:
        return f"{self.delta} {self.delta_ci}".strip()

    def text(self) -> str:
        """One-line form for Markdown and plain text."""
        out = self.value + (f" {self.interval}" if self.interval else "")
        sym = f" {self.symbol}" if self.symbol else ""
        if self.delta:
            out += f" (Δ {self.diff}{sym})"
        elif self.delta_ci:  # KLD (its value is the difference) and flips: no Δ to show
            out += f" ({self.delta_ci}{sym})"
        else:
            out += sym
        return out


def plain(value: Any) -> Cell:
    return Cell(fmt(value))


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    header: list[str]  # full column names (Markdown, lookups)
    rows: list[list[Cell]]
    caption: str = ""
    groups: list[tuple[str, int]] = field(default_factory=list)  # HTML: (group label, columns spanned) above...
    short: list[str] = field(default_factory=list)  # ...these short column labels (first column excluded)
    numeric: bool = False  # cells are measurements (values shown bold, with intervals and differences)

    @property
    def empty(self) -> bool:
        return not self.rows


# -- number formats ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """How a metric is shown: `kind` picks the format, `better` is +1 (higher is better), -1 or 0."""

    kind: str  # pct, score, rating, num, kld, ms, s, mb, count (MetricSpec.fmt)
    better: int


def spec_for(suite: str, metric: str) -> Spec:
    """The display spec from the metric's declaration (evalkit.metrics.declarations), never from its name.

    An undeclared metric (a newer evalkit's run, say) is shown as a plain number with no better/worse
    mark, and logged; tests require every emitted metric to be declared.
    """
    declared = metric_spec(suite, metric)
    if declared is None:
        log.warning("metric %s/%s is not declared: shown without a better/worse mark", suite, metric)
        return Spec("num", 0)
    return Spec(declared.fmt, declared.better)


def better_note(suite: str, metric: str) -> str:
    """" (↑ better)" / " (↓ better)" from the metric's declared direction; "" when it has none."""
    return {1: " (↑ better)", -1: " (↓ better)"}.get(spec_for(suite, metric).better, "")


def isnum(x: Any) -> TypeGuard[numbers.Real]:
    """A finite real number (numpy scalars from pandas included; booleans and NaN are not numbers here)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def signed(text: str) -> str:
    return text.replace("-", MINUS)


SCALE = {"pct": 100.0, "ms": 1000.0}
UNIT = {"pct": "%", "ms": " ms", "s": " s"}
DIFF_UNIT = {"pct": " pts", "ms": " ms", "s": " s"}


def _spec(kind: str, magnitude: float) -> str:
    """Format spec for numbers of this kind near this magnitude (both ends of an interval share one)."""
    fixed = {"pct": ".1f", "score": ".1f", "rating": ".2f", "ms": ".0f", "s": ".1f", "count": ".0f"}
    if kind in fixed:
        return fixed[kind]
    if kind == "kld":
        return "#.2g"  # two significant digits: KLD spans decades, its SE makes a third digit noise
    return ".1f" if magnitude >= 100 else ".2f" if magnitude >= 1 else ".3g"


def _num(x: float, kind: str, magnitude: float | None = None, sign: str = "") -> str:
    x *= SCALE.get(kind, 1.0)
    m = abs(x) if magnitude is None else magnitude * SCALE.get(kind, 1.0)
    return signed(f"{x:{sign}{_spec(kind, m)}}")


def fmt(x: Any, kind: str = "num") -> str:
    """A value in display units: pct as %, ms from seconds, magnitude-dependent digits otherwise."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if not isnum(x):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)
    x = float(x)
    if kind == "mb":  # *_mb metrics are recorded in MiB (2^20 bytes); shown in GB/MB of 10^9/10^6 bytes
        b = x * 2**20
        return f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.0f} MB"
    if kind == "num" and x == int(x) and abs(x) < 1e6:
        return signed(f"{x:,.0f}")
    if kind == "num" and abs(x) >= 1000:
        return signed(f"{x:,.0f}")
    return _num(x, kind) + UNIT.get(kind, "")


def fmt_interval(lo: Any, hi: Any, kind: str = "num") -> str:
    if not (isnum(lo) and isnum(hi)):
        return ""
    m = max(abs(float(lo)), abs(float(hi)))
    return f"[{_num(float(lo), kind, m)}, {_num(float(hi), kind, m)}]"


def fmt_delta(diff: Any, kind: str = "num") -> str:
    return _num(float(diff), kind, sign="+") + DIFF_UNIT.get(kind, "") if isnum(diff) else ""


def fmt_diff(diff: Any, lo: Any, hi: Any, kind: str = "num") -> str:
    """A difference with its interval in one string, e.g. "−7.0 pts [−15.0, −2.0]"."""
    if not isnum(diff):
        return ""
    return f"{fmt_delta(diff, kind)} {fmt_interval(lo, hi, kind) or '(no interval)'}"


def mark_for(diff: Any, lo: Any, hi: Any, significant: Any, better: int) -> Mark:
    if not (isnum(lo) and isnum(hi)):
        return "na"
    if not bool(significant):
        return "same"
    if better == 0 or not isnum(diff) or float(diff) == 0:
        return "changed"
    return "better" if float(diff) * better > 0 else "worse"


def z_score(c: dict[str, Any] | pd.Series) -> float:
    """|difference| in units of its own uncertainty (half the interval / 1.96): ranks 'biggest' across metrics."""
    lo, hi, d = c.get("ci_low"), c.get("ci_high"), c.get("diff")
    if not (isnum(lo) and isnum(hi) and isnum(d)):
        return 0.0
    half = (float(hi) - float(lo)) / 2
    return abs(float(d)) / (half / 1.96) if half > 0 else math.inf


def cell(score: pd.Series | dict | None, comp: pd.Series | dict | None, spec: Spec, is_reference: bool = False) -> Cell:
    """Value and interval from a score row; difference, interval, mark and method from a comparison row."""
    src = score if score is not None else comp
    if src is None:
        return Cell("–")
    value = fmt(src.get("value"), spec.kind)
    interval = fmt_interval(score.get("ci_low"), score.get("ci_high"), spec.kind) if score is not None else ""
    if is_reference:
        return Cell(value, interval, note="reference")
    if comp is None:
        return Cell(value, interval)
    delta = fmt_delta(comp.get("diff"), spec.kind)
    missing = "(too few items for an interval)" if "too few" in str(comp.get("method") or "") else "(no interval)"
    delta_ci = (fmt_interval(comp.get("ci_low"), comp.get("ci_high"), spec.kind) or missing) if delta else ""
    mark = mark_for(comp.get("diff"), comp.get("ci_low"), comp.get("ci_high"), comp.get("significant"), spec.better)
    p = comp.get("p_value")
    note = "; ".join(x for x in (str(comp.get("method") or ""), f"n = {fmt(comp.get('n'), 'count')}",
                                 f"p = {float(p):.3g}" if isnum(p) else "") if x)
    return Cell(value, interval, delta, delta_ci, mark, note, z_score(comp))


@dataclass
class Example:
    """One item with every deployment's output side by side (model text: escaped on rendering)."""

    title: str
    prompt: str
    outputs: list[tuple[str, str, str]] = field(default_factory=list)  # (deployment, verdict, text)


EXAMPLE_CHARS = 1500  # longer outputs are cut (the full text is in records/ and items/)


def cut(text: Any) -> str:
    """A model output as an example shows it: at most EXAMPLE_CHARS characters, saying how many more there were."""
    text = "" if text is None else str(text)
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + f" …[{len(text) - EXAMPLE_CHARS} more characters]"
