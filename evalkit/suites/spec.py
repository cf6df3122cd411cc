"""What a suite declares about itself: one `SuiteSpec` per suite module, read by everything outside
`evalkit/suites/` (config, records, metric declarations, preflight, scoring, report, viewer).

As `EngineSpec` is the engine's: adding a suite = one module holding its settings model, record type(s),
metric declarations, suite class and `SPEC`, plus one line in `evalkit.suites.SUITES`. The report section,
verdict columns and viewer cells are optional: without them the report shows a table of the suite's
declared metrics and the viewer shows each record's generated text (`Generation`) or nothing.

This module is in the foundation layer (as `evalkit.engines.spec`): it imports nothing above it. Presentation
hooks that need the report's types are named by dotted strings ("module:function"), loaded by the report
when it draws (the registry's way of reaching up, by name and at run time).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel

from evalkit.metrics.declarations import MetricSpec


@dataclass
class ItemCell:
    """How the viewer shows one record in its item matrix (built by `SuiteSpec.viewer_cell`).

    `text`: the cell (what "differs" compares); `value`: a short comparable value (None: compare `text`);
    `ok`: 1 pass, 0 fail, -1 unknown (the per-item CSV's pass/fail column overrides it); `extra`: shown on the
    item page; `prompt_ids` / `output_ids`: token ids; `prompt`: the prompt text naming the item's row."""

    text: str
    value: str | None = None
    ok: int = -1
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_ids: Any = None
    output_ids: Any = None
    prompt: str = ""


@dataclass(frozen=True)
class ViewerSpec:
    """A suite's place in the viewer's item matrix.

    - `items`: False for a suite whose records are not items (cost: one per concurrency level).
    - `cell(record) -> ItemCell`: None: the record's generation (output text and token ids), if it has one.
    - `figures`: (per-item CSV metric, label, format) pairs making a cell whose record has no text (the
      perplexity chunk's figures); `value_metric`: the figure the cell's comparable value is.
    - `word_diff`: whether the cell text is diffed word by word against the reference's.
    - `token_ids(record, run_dir)`: token ids kept out of the record (a side file), read on demand.
    """

    items: bool = True
    cell: Callable[[Any], ItemCell] | None = None
    figures: tuple[tuple[str, str, str], ...] = ()
    value_metric: str | None = None
    word_diff: bool = True
    token_ids: Callable[[Any, Any], Any] | None = None


@dataclass
class DiskNeed:
    """The disk a suite's records need in a run beyond their lines (`SuiteSpec.disk`), in bytes by kind.

    `records`: the records' lines; `side_files`: per-token arrays kept beside them; `distributions`: stores kept in
    the run directory (perplexity: the exact-KLD reference's distributions; with `window`, at most that many chunks
    at a time); `cache`: what the result cache keeps of them. `distributions_full` / `distributions_per_chunk`: the
    whole store and one chunk's, and `window_setting` the setting that streams it ("suites.<name>.<field>"), so a
    refusal can say which window would fit. `notes`: lines the plan prints."""

    records: int = 0
    side_files: int = 0
    distributions: int = 0
    cache: int = 0
    window: int | None = None
    distributions_full: int = 0
    distributions_per_chunk: int = 0
    window_setting: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SuiteSpec:
    """One suite's declaration.

    - `name`: its key under `suites:` in the config, in records (`suite`), scores and the report.
    - `settings_model`: the pydantic model `suites.<name>` validates against.
    - `suite_class`: the `evalkit.suites.base.Suite` subclass that runs and scores it.
    - `records`: its record type(s) (subclasses of evalkit.records.Record whose `suite` literal is `name`).
    - `metrics`: every metric it emits (evalkit.metrics.declarations.MetricSpec, `suite` = `name`).
    - `title`: its report section's heading; `report`: "module:function" building that section's parts from
      the report's RunView (None: a table of the declared metrics); `verdict`: "module:function" giving its
      verdict-table columns (None: none).
    - `signatures`: "module:function" (view, its describe() dict) -> [(what, value)] rows of the report's
      signatures table (None: describe() flattened); `memory`: "module:function" (view, deployment) -> (bytes,
      where) | None, the highest memory the suite measured (the ledger shows it beside the prediction).
    - `viewer`: its cells in the viewer (`ViewerSpec`).
    - `check(suite, items, config, config_file)`: plan-time checks of its data against the config (raise an
      EvalkitError); None: a suite with no items is refused. `config_check(settings, config)`: checks across
      config sections, run by config validation (raise ValueError: one line).
    - `plan_note(config, config_file) -> str | None`: lines `evalkit plan` prints for the suite before anything runs
      (perplexity: which deployments get exact KLD and how large the stored distributions get).
    - `quality`: False for a suite whose metrics are limits of a workload (cost), never quality margins: the
      decision reads it (evalkit.suites.workload_suite) at a concurrency level, its categories being the levels
      ("c8": concurrency 8), its figures the metrics whose declaration names a `role` (MetricSpec.role).
    - `offline_description(settings)`: what the report shows instead of `describe()` when describing the suite would
      reach the network (None: describe() runs offline).
    - `n_unit`: what `n` counts in its intervals ("items"; perplexity's are over scored tokens), as the decision
      says it ("about 84 scored tokens would be needed").
    - `workload(settings) -> {field: int}`: what the suite asks of an engine beyond its options, as fields of
      evalkit.ledger.Workload (the memory plan takes each field's largest over the enabled suites); None: nothing
      beyond one request's last logit row.
    - `metric_settings`: settings that leave the items as they are but can change some metrics, each with the
      metrics it can change (empty: none). Two runs that differ only there are comparable (evalkit.history),
      for every other metric. A setting not named here (and not a size or data-path setting) defines the items.
    - `runs`: False for a suite scored from files its run directory gets after the run (imported human ratings, a
      model judge's answers): never planned, run or configured under `suites:` (config knows only the suites that
      run), no records; scoring asks `rows` for its score and comparison rows. Its report section (`report`, which
      may give None) follows the section of the suite whose outputs it grades (`rated_outputs`); its verdict
      columns (`verdict`) come before those of the suites that run.
    - `rows`: "module:function" (run_dir, StatsSettings) -> (score rows, comparison rows), for `runs` False.
    - `rated_outputs`: this suite's generated outputs are the ones humans rate and the model judge grades
      (evalkit.suites.rated_suite); `rubric(category, rubrics_dir) -> str`: the rubric summary a rating sheet shows
      for a category of them ("pairwise": the side-by-side one).
    - `disk(suite, config, config_file, deployments, use_cache) -> DiskNeed`: the disk the suite needs for those
      deployments (names; a noise-floor re-run is "<reference>.rerun"), evalkit.diskplan; None: its items' records
      at a generous size per line.
    - `arrays(record, run_dir, where)`: a record's per-token arrays (a numpy structured array), None when the record
      keeps none (evalkit.results.Run.token_arrays); None: the suite's records keep no arrays.
    """

    name: str
    settings_model: type[BaseModel]
    suite_class: type
    records: tuple[type[BaseModel], ...]
    metrics: tuple[MetricSpec, ...]
    title: str = ""
    report: str | None = None
    verdict: str | None = None
    signatures: str | None = None
    memory: str | None = None
    viewer: ViewerSpec = ViewerSpec()
    check: Callable[..., None] | None = None
    config_check: Callable[[Any, Any], None] | None = None
    plan_note: Callable[[Any, Any], str | None] | None = None
    quality: bool = True
    offline_description: Callable[[Any], dict[str, Any] | None] | None = None
    metric_settings: dict[str, frozenset[str]] = field(default_factory=dict)
    workload: Callable[[Any], dict[str, int]] | None = None
    n_unit: str = "items"
    runs: bool = True
    rows: str | None = None
    rated_outputs: bool = False
    rubric: Callable[[str, Any], str] | None = None
    disk: Callable[..., DiskNeed] | None = None
    arrays: Callable[[Any, Any, str], Any] | None = None

    def __post_init__(self) -> None:
        if not self.runs and (self.rows is None or self.records):
            raise ValueError(f"suite {self.name!r}: a suite that is not run declares `rows` and no record types")
        for m in self.metrics:
            if m.suite != self.name:
                raise ValueError(f"suite {self.name!r}: metric {m.suite}/{m.name} is declared for another suite")
        for r in self.records:
            literal = getattr(r.model_fields.get("suite"), "default", None)
            if literal != self.name:
                raise ValueError(f"suite {self.name!r}: record type {r.__name__} has suite {literal!r}")
        declared = {m.name for m in self.metrics}
        for setting, metrics in self.metric_settings.items():
            if setting not in self.settings_model.model_fields:
                raise ValueError(f"suite {self.name!r}: metric_settings names {setting!r}, not one of its settings")
            if not metrics <= declared:
                raise ValueError(f"suite {self.name!r}: metric_settings[{setting!r}] names undeclared metrics "
                                 f"{sorted(metrics - declared)}")

    @property
    def label(self) -> str:
        return self.title or self.name
