"""Which executor ran a run, in its manifest (both executors record themselves here).

Its own module so that the executors import it without importing their package's factory (no circle).
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from evalkit.store import RunDir


def record_execution(run: RunDir, info: dict[str, Any]) -> None:
    """The manifest says which executor ran the run (latest in `executor`, every start in `executions`)."""
    manifest = run.manifest()
    info = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), **info}
    manifest["executor"] = info
    manifest["executions"] = [*manifest.get("executions", []), info]
    run.write_manifest(manifest)
