"""What a suite is: items from data, engine calls for pending items, scores from records alone.

A suite never knows which engine runs it, and scoring never loads a model.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Mapping, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict

from evalkit.config import Config
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import DataError
from evalkit.metrics.stats import StatsSettings
from evalkit.records import Record, typed
from evalkit.engines.spec import Capability
from evalkit.store import ComparisonRow, ScoreRow

# Appends a batch of finished records, each `dump_record(<the suite's Record type>)` (flushed per call).
Emit = Callable[[list[dict[str, Any]]], None]
SettingsT = TypeVar("SettingsT", bound=BaseModel)  # the suite's block of the config (`suites.<name>`)
RecordT = TypeVar("RecordT", bound=Record)
# What scoring hands a suite: deployment -> its parsed records of this suite (evalkit.records.parse_record).
SuiteRecords = Mapping[str, list[RecordT]]
# Builds the error for line n of a data file (with the problem); each file format names its lines one way.
LineError = Callable[[int, str], DataError]


@dataclass(frozen=True)
class Item:
    """One unit of work, with an id stable across runs and deployments."""

    item_id: str
    category: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoreContext:
    """What scoring may know: the run's deployments, its reference and its config. No engines."""

    deployments: list[str]
    reference: str
    config: Config
    config_file: Path
    manifest: dict[str, Any]
    run_dir: Path | None = None  # where records' side files are (None: records held in memory only)

    @property
    def stats(self) -> StatsSettings:
        """The run's statistical policy (alpha, bootstrap samples, seed); defaults for older runs."""
        return getattr(self.config, "stats", None) or StatsSettings()


@dataclass(frozen=True)
class RunBinding:
    """Where a suite is running: the run directory, the deployment being run and the run's reference.

    Suites that share engine-side artefacts between deployments (perplexity: the reference's stored
    distributions) need it; the others ignore it."""

    run_dir: Path
    deployment: str
    reference: str


class Suite(ABC, Generic[SettingsT]):
    """A suite, generic over its settings model (e.g. `class MmluSuite(Suite["MmluSettings"])`)."""

    name: str = "suite"
    binding: RunBinding | None = None
    # Set by the cached executor (evalkit/executors/cached.py) while it answers this suite's items from the result
    # cache alone: a suite that would wait on another unit (streaming KLD) must not, then.
    cache_pass: bool = False
    # What the engine must be able to do; a deployment whose engine lacks one is skipped at plan time
    # (evalkit/capabilities.py). An instance may narrow or widen it from its settings.
    requires: frozenset[Capability] = frozenset()
    # At least one of these too (when any are named): a suite with more than one way to measure (MMLU: the
    # answer position's next-token log-probs, or each choice scored as a continuation from prompt log-probs).
    requires_any: frozenset[Capability] = frozenset()

    def runs_after(self, deployment: str, spec: Any) -> frozenset[str]:
        """Deployments whose units must finish before this suite runs for `deployment` (whose config entry is
        `spec`): those whose run-directory artefacts it reads (perplexity: the KLD reference's stored
        distributions). Both executors order units by it (evalkit/executors/order.py)."""
        return frozenset()

    def runs_beside(self, deployment: str, spec: Any) -> frozenset[str]:
        """Deployments whose units must run at the same time as `deployment`'s (perplexity in streaming-KLD
        mode: the KLD reference and its readers, the reference's store holding only a window of chunks). The
        local executor starts such a group together (evalkit/executors/order.py: concurrent_groups)."""
        return frozenset()

    def bind(self, binding: RunBinding) -> None:
        """Called by the worker before `run`."""
        self.binding = binding

    def __init__(self, settings: SettingsT, config: Config, config_file: Path) -> None:
        self.settings = settings
        self.config = config
        self.config_file = config_file

    @abstractmethod
    def items(self) -> list[Item]:
        """The suite's items, identical for every deployment (deterministic for a given config)."""

    @abstractmethod
    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        """Run `items` (only the pending ones are passed) and emit one record per item.

        Each record is built as the suite's type in evalkit.records and emitted as `dump_record(record)`.
        """

    @abstractmethod
    def score(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[ScoreRow]:
        """Per-deployment scores from records alone (`records` maps deployment -> its typed records)."""

    def compare(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[ComparisonRow]:
        """Paired differences of each deployment against the reference on the same items."""
        return []

    def item_rows(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[dict[str, Any]]:
        """Per-item scores for manual review CSVs (item_id, deployment, output, each per-item score)."""
        return []

    def scored(self, records: SuiteRecords[Any], ctx: ScoreContext) -> "Scored":
        """Everything scoring writes for this suite, from one call: scores, comparisons and per-item rows. The
        records are parsed once here; a suite whose three parts share work (sandbox runs, pairings) overrides
        this to do that work once."""
        parsed = typed(records)
        return Scored(self.score(parsed, ctx), self.compare(parsed, ctx), self.item_rows(parsed, ctx))

    def describe(self) -> dict[str, Any]:
        """Provenance for the manifest and report (data files, seeds, signatures)."""
        return {}


class NoSettings(BaseModel):
    """The settings of a suite with nothing to set (one scored from its run directory's files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class RunDirSuite(Suite[NoSettings]):
    """A suite scored from files its run directory gets after the run (SuiteSpec.runs False: imported human ratings,
    a model judge's answers): it has no items and is never run; its rows come from its spec's `rows` hook."""

    # It grades generated outputs: sampling settings change its results (evalkit.history reads this).
    requires = frozenset({Capability.GENERATE})

    def items(self) -> list[Item]:
        return []

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        raise TypeError(f"suite {self.name!r} is scored from its run directory's files, never run")

    def score(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[ScoreRow]:
        return self.scored(records, ctx).scores

    def scored(self, records: SuiteRecords[Any], ctx: ScoreContext) -> "Scored":
        from evalkit.suites import load_hook, suite_spec

        hook = suite_spec(self.name).rows
        if hook is None or ctx.run_dir is None:
            return Scored([], [], [])
        scores, comparisons = load_hook(hook)(ctx.run_dir, ctx.stats)
        return Scored(scores, comparisons, [])


@dataclass(frozen=True)
class Scored:
    """What scoring takes from a suite (`Suite.scored`): scores.csv and comparisons.csv rows, items/<suite>.csv rows."""

    scores: list[ScoreRow]
    comparisons: list[ComparisonRow]
    items: list[dict[str, Any]]


# -- helpers for suites -----------------------------------------------------------------------


def at_line(path: Path) -> LineError:
    """Errors as `<path>:<n>: <problem>`, the form editors and terminals jump to."""
    return lambda n, problem: DataError(f"{path}:{n}", problem)


def jsonl_values(text: str, line_error: LineError) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSONL data file; a line that is not JSON
    raises `line_error`, so the user is told the file and line before anything runs."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise line_error(n, f"not valid JSON ({e.msg})") from None
        yield n, value


def paired_with_reference(records: SuiteRecords[RecordT], reference: str,
                          keep: Callable[[RecordT], bool] = lambda r: True) -> dict[str, list[tuple[RecordT, RecordT]]]:
    """deployment -> its records paired as (reference's, deployment's) on the same item, for every deployment but
    the reference (in the deployment's record order; items the reference lacks are left out, and records
    `keep` rejects on either side). Empty when the reference has no records: there is nothing to compare."""
    if reference not in records:
        return {}
    ref_by = {r.item_id: r for r in records[reference] if keep(r)}
    return {dep: [(ref_by[r.item_id], r) for r in recs if keep(r) and r.item_id in ref_by]
            for dep, recs in records.items() if dep != reference}
