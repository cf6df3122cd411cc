"""`evalkit.load_run(path)`: a finished run as pandas DataFrames, for notebooks and scripts."""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from evalkit.store import COMPARISONS_CSV, ITEMS_DIR, SCORES_CSV, RunDir

if TYPE_CHECKING:
    from evalkit.decision import Decision


class Run:
    """Read-only view of a run directory. Every frame is computed from files written by the pipeline."""

    def __init__(self, path: str | Path) -> None:
        self.run_dir = RunDir.open(Path(path))
        self.path = self.run_dir.path

    @cached_property
    def manifest(self) -> dict[str, Any]:
        return self.run_dir.manifest()

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def reference(self) -> str:
        return self.manifest["reference"]

    @property
    def deployments(self) -> list[str]:
        return list(self.manifest["deployment_order"])

    def _csv(self, name: str) -> pd.DataFrame:
        path = self.path / name
        if not path.exists() or path.stat().st_size == 0:
            return pd.DataFrame()
        return pd.read_csv(path, encoding="utf-8-sig")

    @cached_property
    def scores(self) -> pd.DataFrame:
        """Tidy scores: deployment, suite, category, metric, value, ci_low, ci_high, n."""
        return self._csv(SCORES_CSV)

    @cached_property
    def comparisons(self) -> pd.DataFrame:
        """Paired differences against the reference, with intervals and significance."""
        return self._csv(COMPARISONS_CSV)

    @cached_property
    def items(self) -> pd.DataFrame:
        """Per-item scores of every suite (one row per item and deployment)."""
        frames = []
        for p in sorted((self.path / ITEMS_DIR).glob("*.csv")):
            df = pd.read_csv(p, encoding="utf-8-sig")
            frames.append(df if "suite" in df else df.assign(suite=p.stem))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @cached_property
    def records(self) -> pd.DataFrame:
        """Records (one row per finished item and deployment), read through evalkit.records: older layouts
        upgraded, so every row has schema_version, deployment, cached and measured_at. A record's generation
        (evalkit.records.Generation) is spread into columns: output_text, output_token_ids, n_output_tokens,
        finish_reason, ttft_s, total_s."""
        from evalkit.records import parse_record

        rows = [_flat(parse_record({**r, "deployment": r.get("deployment") or d}, str(self.run_dir.records_path(d))))
                for d in self.deployments for r in self.run_dir.records(d)]
        return pd.DataFrame(rows)

    def token_arrays(self, deployment: str, item_id: str, suite: str | None = None) -> Any:
        """The per-token arrays of one record (a numpy structured array: a perplexity chunk's, fields among its
        records module's TOKEN_FIELDS), from its side file (v2) or its inline lists (v1): the first record of
        `item_id` (in `suite`, when given) whose suite keeps per-token arrays (SuiteSpec.arrays)."""
        from evalkit.errors import RunDirError
        from evalkit.records import parse_record
        from evalkit.suites import SUITES, suite_spec

        where = str(self.run_dir.records_path(deployment))
        for raw in self.run_dir.records(deployment):
            name = raw.get("suite")
            if raw.get("item_id") != item_id or name not in SUITES or (suite is not None and name != suite):
                continue
            arrays = suite_spec(name).arrays
            if arrays is not None:
                found = arrays(parse_record({**raw, "deployment": raw.get("deployment") or deployment}, where), self.path, where)
                if found is not None:
                    return found
        raise RunDirError(where, f"no record {item_id!r} with per-token arrays" + (f" in suite {suite!r}" if suite else ""))

    @cached_property
    def ratings(self) -> pd.DataFrame:
        """Imported human ratings, de-blinded (empty when none were imported)."""
        try:
            from evalkit.rating.aggregate import ratings_frame
        except ImportError:
            return pd.DataFrame()
        return ratings_frame(self.path)

    @cached_property
    def decision(self) -> "Decision | None":
        """The recommendation scoring wrote (decision.json), or None when the config has no `decision:`."""
        from evalkit.decision import load_decision

        return load_decision(self.path)

    def decide(self, margins: dict[str, float] | None = None, workload: dict[str, Any] | None = None,
               scenarios: list[dict[str, Any]] | None = None) -> "Decision":
        """Re-decide from this run's scores and comparisons with other margins / workloads; runs nothing.

        Unspecified parts come from the run's config `decision:` block; margins are validated like the config's.
        """
        from evalkit.config import Config, DecisionSettings
        from evalkit.decision import decide_from

        config = Config.model_validate(self.manifest["config"])
        base = config.decision.model_dump(mode="json") if config.decision else {}
        settings = DecisionSettings.model_validate({
            "workload": workload if workload is not None else base.get("workload", {}),
            "margins": margins if margins is not None else base.get("margins", {}),
            "scenarios": scenarios if scenarios is not None else base.get("scenarios", []),
            **({"throughput_tie": base["throughput_tie"]} if "throughput_tie" in base else {}),
        })
        decision = decide_from(config, Path(self.manifest["config_file"]), self.manifest, self.scores, self.comparisons, settings)
        assert decision is not None
        return decision

    @cached_property
    def engines(self) -> pd.DataFrame:
        rows = [json.loads(p.read_text()) for p in sorted((self.path / "engines").glob("*.json"))]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, deployments={self.deployments}, reference={self.reference!r})"


def _flat(record: Any) -> dict[str, Any]:
    """A typed record as one frame row, its `generation` part spread into columns."""
    row = record.model_dump(mode="json")
    generation = getattr(record, "generation", None)
    if generation is not None:
        row.pop("generation", None)
        row.update(generation.model_dump(mode="json"), n_output_tokens=generation.n_output_tokens)
    return row
