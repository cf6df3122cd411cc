"""What a suite is: items from data, engine calls for pending items, scores from records alone.

A suite never knows which engine runs it, and scoring never loads a model.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from pydantic import BaseModel

from evalkit.config import Config, StatsSettings
from evalkit.engines.base import Engine, SamplingParams
from evalkit.records import Record
from evalkit.engines.spec import Capability
from evalkit.store import ComparisonRow, ScoreRow

# Appends a batch of finished records, each `dump_record(<the suite's Record type>)` (flushed per call).
Emit = Callable[[list[dict[str, Any]]], None]
SettingsT = TypeVar("SettingsT", bound=BaseModel)  # the suite's block of the config (`suites.<name>`)
RecordT = TypeVar("RecordT", bound=Record)
# What scoring hands a suite: deployment -> its parsed records of this suite (evalkit.records.parse_record).
SuiteRecords = Mapping[str, list[RecordT]]


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
    # What the engine must be able to do; a deployment whose engine lacks one is skipped at plan time
    # (evalkit/capabilities.py). An instance may narrow or widen it from its settings.
    requires: frozenset[Capability] = frozenset()

    def runs_after(self, deployment: str, spec: Any) -> frozenset[str]:
        """Deployments whose units must finish before this suite runs for `deployment` (whose config entry is
        `spec`): those whose run-directory artefacts it reads (perplexity: the KLD reference's stored
        distributions). Both executors order units by it (evalkit/executors/order.py)."""
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

    def describe(self) -> dict[str, Any]:
        """Provenance for the manifest and report (data files, seeds, signatures)."""
        return {}
