"""Every metric evalkit emits, declared once: unit, direction, kind, display format and paired test.

The report, verdict and plots read these declarations (never a metric's name) to decide which way is
better and how to show a number; tests fail on a metric that a suite emits but nobody declared.

Names ending in "*" declare a family whose members differ only by a suffix (e.g. "bleu_en-*" covers
"bleu_en-zh" and "bleu_en-de"); an exact declaration wins over a family.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower", "none"]
Kind = Literal["rate", "continuous", "count"]
PairedTest = Literal["mcnemar", "paired_bootstrap", "corpus_bootstrap", "none"]
# Display formats understood by evalkit.report.cells: pct (a share shown in %), score (0-100 points),
# rating (1-5 scale), num (magnitude-dependent digits), kld (two significant digits), ms (seconds shown
# in ms), s (seconds), mb (values in MiB, shown as MB/GB of 10^6/10^9 bytes), count (integer).
Fmt = Literal["pct", "score", "rating", "num", "kld", "ms", "s", "mb", "count"]


@dataclass(frozen=True)
class MetricSpec:
    suite: str
    name: str
    unit: str
    direction: Direction
    kind: Kind
    fmt: Fmt
    paired_test: PairedTest
    description: str = ""
    # What the decision reads it as, for a workload suite's metrics (SuiteSpec.quality False): "tokens_per_s"
    # (throughput), "per_request_tokens_per_s", "ttft_s" (median time to first token); "" for any other metric.
    role: str = ""

    @property
    def better(self) -> int:
        """+1 when higher is better, -1 when lower is, 0 when neither."""
        return {"higher": 1, "lower": -1, "none": 0}[self.direction]


_m = MetricSpec  # the table below passes MetricSpec's fields by position, one declaration a line


def flip_metrics(suite: str) -> list[MetricSpec]:
    """The flip metrics of a pass/fail suite compared item by item with the reference (mmlu, humaneval)."""
    flips: tuple[tuple[str, Direction, str], ...] = (
        ("flip_rate", "lower", "share of items whose correctness changed against the reference"),
        ("flips_right_to_wrong", "lower", "share of items the reference got right and the deployment wrong"),
        ("flips_wrong_to_right", "higher", "share of items the reference got wrong and the deployment right"),
    )
    return [_m(suite, n, "share", d, "rate", "pct", "mcnemar", t) for n, d, t in flips]


# Every suite declares its metrics in its SuiteSpec (evalkit/suites/<suite>.py: `metrics`), the imported human
# ratings and the model judge too (evalkit/suites/ratings.py, judge.py).


def _index(specs: list[MetricSpec]) -> tuple[dict[tuple[str, str], MetricSpec], list[MetricSpec]]:
    exact: dict[tuple[str, str], MetricSpec] = {}
    families: list[MetricSpec] = []
    for s in specs:
        if s.name.endswith("*"):
            families.append(s)
        elif (s.suite, s.name) in exact:
            raise ValueError(f"metric {s.suite}/{s.name} declared twice")
        else:
            exact[(s.suite, s.name)] = s
    return exact, families


_EXACT: dict[tuple[str, str], MetricSpec] = {}
_FAMILIES: list[MetricSpec] = []
_DECLARED: list[MetricSpec] = []
_STATE: list[object] = [None]  # the suite registry's state the tables above were built from


def _declared() -> list[MetricSpec]:
    """Every declaration: the registered suites' (SuiteSpec.metrics). The suite registry imports
    this module (MetricSpec), so this one reaches the registry as registries are reached: by name, at run time."""
    registry = importlib.import_module("evalkit.suites")
    state = registry.registry_state()
    if _STATE[0] != state:
        found = [m for spec in registry.all_specs() for m in spec.metrics]
        exact, families = _index(found)
        _EXACT.clear()
        _EXACT.update(exact)
        _FAMILIES[:] = families
        _DECLARED[:] = found
        _STATE[0] = state
    return _DECLARED


def metric_spec(suite: str, name: str) -> MetricSpec | None:
    """The declaration of `name` in `suite` (a family member matches its family), or None."""
    _declared()
    found = _EXACT.get((suite, name))
    if found is not None:
        return found
    for fam in _FAMILIES:
        if fam.suite == suite and name.startswith(fam.name[:-1]) and len(name) > len(fam.name) - 1:
            return fam
    return None


def require_spec(suite: str, name: str) -> MetricSpec:
    """metric_spec, but an undeclared metric is a programming error (raised, naming it)."""
    found = metric_spec(suite, name)
    if found is None:
        raise KeyError(f"metric {suite}/{name} is not declared in evalkit/metrics/declarations.py")
    return found


def all_metrics() -> list[MetricSpec]:
    return list(_declared())


# -- margin keys (`decision.margins`): checked here, against the declarations, by config and decision ------

@dataclass(frozen=True)
class MarginKey:
    suite: str
    category: str | None  # None: the suite's overall category ("all", or the only one there is)
    metric: str

    @classmethod
    def parse(cls, key: str) -> "MarginKey":
        parts = key.split("/")
        if len(parts) == 2 and all(parts):
            return cls(parts[0], None, parts[1])
        if len(parts) == 3 and all(parts):
            return cls(parts[0], parts[1], parts[2])
        raise ValueError(f"margin key {key!r}: expected 'suite/metric' or 'suite/category/metric'")


def _declared_suites() -> set[str]:
    return {m.suite for m in _declared()}


def _quality_suites() -> set[str]:
    """Suites whose metrics may be quality margins: all but those whose spec says they measure a workload's
    limits (SuiteSpec.quality False)."""
    registry = importlib.import_module("evalkit.suites")
    limits = {spec.name for spec in registry.all_specs() if not spec.quality}
    return _declared_suites() - limits


def direction_of(suite: str, metric: str) -> str | None:
    """The declared direction ("higher" / "lower" / "none") of a metric, None when undeclared."""
    spec = metric_spec(suite, metric)
    return spec.direction if spec else None


def check_margin_key(key: str) -> MarginKey:
    """A margin key that names a declared metric with a better direction; ValueError (one line) otherwise."""
    mk = MarginKey.parse(key)
    quality = _quality_suites()
    if mk.suite in _declared_suites() and mk.suite not in quality:
        raise ValueError(f"margin {key!r}: {mk.suite} is not a quality margin; state limits under decision.workload "
                         "(max_ttft_ms, min_tokens_per_s)")
    direction = direction_of(mk.suite, mk.metric)
    if direction is None:
        names = sorted(f"{m.suite}/{m.name}" for m in all_metrics() if m.suite in quality and m.direction != "none")
        close = difflib.get_close_matches(f"{mk.suite}/{mk.metric}", names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"margin {key!r}: unknown metric {mk.suite}/{mk.metric}{hint}")
    if direction not in ("higher", "lower"):
        raise ValueError(f"margin {key!r}: {mk.suite}/{mk.metric} has no better direction, so no loss to bound")
    return mk
