"""The run as the report reads it: lookups over a Run's frames, suite provenance, measured memory."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from evalkit.records import dump_record, parse_record
from evalkit.report.cells import Cell, cell, spec_for
from evalkit.results import Run


class RunView:
    """Lookups over a Run's frames; every method returns None / empty when the data are absent."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.reference = run.reference
        self.deployments = run.deployments
        self.scores = run.scores
        self.comps = run.comparisons
        self._items: dict[str, pd.DataFrame] = {}

    @cached_property
    def _score_positions(self) -> dict[tuple[Any, Any, str, Any], int]:
        return _positions(self.scores)

    @cached_property
    def _comp_positions(self) -> dict[tuple[Any, Any, str, Any], int]:
        return _positions(self.comps)

    def has(self, suite: str) -> bool:
        return (not self.scores.empty and bool((self.scores.suite == suite).any())) or not self.items(suite).empty

    def score(self, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
        return _row(self.scores, self._score_positions, dep, suite, category, metric)

    def comp(self, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
        if dep == self.reference:
            return None
        row = _row(self.comps, self._comp_positions, dep, suite, category, metric)
        # a margin row on a value with no difference (evalkit/decision.py) is not a comparison to show as Δ
        no_diff = row is not None and "decision" in row and pd.notna(row["decision"]) and pd.isna(row["diff"])
        return None if no_diff else row

    def cell(self, dep: str, suite: str, category: str, metric: str, comp_metric: str | None = None) -> Cell:
        spec = spec_for(suite, metric)
        return cell(self.score(dep, suite, category, metric), self.comp(dep, suite, category, comp_metric or metric),
                    spec, dep == self.reference)

    def suite_scores(self, suite: str) -> pd.DataFrame:
        return self.scores[self.scores.suite == suite] if not self.scores.empty else self.scores

    def suite_comps(self, suite: str) -> pd.DataFrame:
        return self.comps[self.comps.suite == suite] if not self.comps.empty else self.comps

    def items(self, suite: str) -> pd.DataFrame:
        """items/<suite>.csv (Run.items concatenates suites without saying which row came from which)."""
        if suite not in self._items:
            path = self.run.path / "items" / f"{suite}.csv"
            empty = not path.exists() or path.stat().st_size == 0
            self._items[suite] = pd.DataFrame() if empty else pd.read_csv(path, encoding="utf-8-sig")
        return self._items[suite]

    def records(self, suite: str) -> dict[str, list[dict[str, Any]]]:
        """Records of one suite per deployment as lines of today's layout (older ones upgraded: evalkit.records);
        model output unescaped: render escapes it."""
        return {d: [dump_record(parse_record(r, f"records/{d}.jsonl")) for r in self.run.run_dir.records(d) if r.get("suite") == suite]
                for d in self.deployments}

    @cached_property
    def level(self) -> str:
        """The run's confidence level as text, "95%" for alpha = 0.05 (config `stats`)."""
        from evalkit.metrics.stats import StatsSettings

        stats = StatsSettings.model_validate(((self.run.manifest.get("config") or {}).get("stats")) or {})
        return f"{100 * (1 - stats.alpha):g}%"

    @cached_property
    def human(self) -> dict[str, pd.DataFrame]:
        """aggregate() tables when ratings were imported, else {}."""
        if self.run.ratings.empty:
            return {}
        from evalkit.rating.aggregate import aggregate

        return aggregate(self.run.path)

    @cached_property
    def suite_info(self) -> dict[str, dict[str, Any]]:
        """Each suite's describe(): from the manifest when the pipeline stored it, else asked now."""
        stored = self.run.manifest.get("suites")
        if isinstance(stored, dict):
            return stored
        return describe_suites(self.run)


def _positions(df: pd.DataFrame) -> dict[tuple[Any, Any, str, Any], int]:
    """(deployment, suite, category as text, metric) -> the position of its first row. The report looks a few
    hundred rows up; a boolean mask over the whole frame per lookup cost about 2 ms each."""
    out: dict[tuple[Any, Any, str, Any], int] = {}
    if not df.empty:
        for pos, key in enumerate(zip(df.deployment, df.suite, df.category.astype(str), df.metric)):
            out.setdefault(key, pos)
    return out


def _row(df: pd.DataFrame, positions: dict[tuple[Any, Any, str, Any], int], dep: str, suite: str, category: str,
         metric: str) -> pd.Series | None:
    pos = positions.get((dep, suite, category, metric))
    return None if pos is None else df.iloc[pos]


def describe_suites(run: Run) -> dict[str, dict[str, Any]]:
    """describe() of every enabled suite, each guarded: provenance must never stop a report.

    Suites whose data would be fetched from the network (`SuiteSpec.offline_description`: MMLU from the hub) are not asked.
    """
    from evalkit.config import Config
    from evalkit.suites import enabled_suites, suite_spec

    out: dict[str, dict[str, Any]] = {}
    try:
        config = Config.model_validate(run.manifest["config"])
        suites = enabled_suites(config, Path(run.manifest["config_file"]))
    except Exception as e:  # an old or hand-edited manifest: say so instead of failing the report
        return {"*": {"error": f"{type(e).__name__}: {e}"}}
    for suite in suites:
        offline = suite_spec(suite.name).offline_description
        instead = offline(suite.settings) if offline is not None else None
        if instead is not None:
            out[suite.name] = instead
            continue
        try:
            out[suite.name] = suite.describe()
        except Exception as e:
            out[suite.name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def measured_peak(view: RunView, dep: str) -> tuple[int, str] | None:
    """The highest memory a suite measured for `dep`, in bytes, with where it was measured: from the first suite
    (registry order) that measures memory (`SuiteSpec.memory`: the cost suite) and has a figure; None without."""
    from evalkit.suites import all_specs, load_hook

    for spec in all_specs():
        if spec.memory is not None:
            found = load_hook(spec.memory)(view, dep)
            if found is not None:
                return found
    return None
