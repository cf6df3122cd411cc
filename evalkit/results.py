"""`evalkit.load_run(path)`: a finished run as pandas DataFrames, for notebooks and scripts."""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from evalkit.scoring import COMPARISONS_CSV, ITEMS_DIR, SCORES_CSV
from evalkit.store import RunDir


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
        """Raw records (one row per finished item and deployment)."""
        rows = [r for d in self.deployments for r in self.run_dir.records(d)]
        return pd.DataFrame(rows)

    @cached_property
    def ratings(self) -> pd.DataFrame:
        """Imported human ratings, de-blinded (empty when none were imported)."""
        try:
            from evalkit.rating.aggregate import ratings_frame
        except ImportError:
            return pd.DataFrame()
        return ratings_frame(self.path)

    @cached_property
    def engines(self) -> pd.DataFrame:
        rows = [json.loads(p.read_text()) for p in sorted((self.path / "engines").glob("*.json"))]
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, deployments={self.deployments}, reference={self.reference!r})"
