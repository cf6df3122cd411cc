"""The runs list: each run's date, config, deployments, reference, recommendation and status.

Status comes from files alone (nothing is locked or opened for writing, so a run being written is never
disturbed): `progress.json` says how many items the run (or its latest resume) planned and finished;
scores.csv says whether it was scored. A run with items left is "running" while its progress or records
changed within the last `ACTIVE_S` seconds, else "partial" when it was scored anyway (some deployment
failed: `run --resume` finishes it) or "resumable" when it stopped before scoring.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evalkit.decision import DECISION_JSON
from evalkit.progress import PROGRESS_FILE, RunProgress
from evalkit.scoring import SCORES_CSV
from evalkit.store import RECORDS_DIR, RunDir
from evalkit.viewer.safety import NotFound, inside, run_names, run_path

ACTIVE_S = 120.0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def status(path: Path, now: float | None = None) -> dict[str, Any]:
    """{"status": finished|running|partial|resumable, "progress": 0..1 or None, "line": text}."""
    now = time.time() if now is None else now
    progress = RunProgress.load(path) if inside(path, path / PROGRESS_FILE) else None
    scored = (path / SCORES_CSV).is_file()
    fraction = progress.fraction() if progress is not None else (1.0 if scored else None)
    last_write = max([_mtime(path / PROGRESS_FILE)] + [_mtime(p) for p in (path / RECORDS_DIR).glob("*.jsonl")])
    pending = fraction is None or fraction < 1.0
    if not pending and scored:
        state, line = "finished", "finished"
    elif now - last_write < ACTIVE_S and (pending or not scored):
        state = "running"
        line = progress.line(now) if progress is not None else "being written"
    elif scored:
        state, line = "partial", "scored with items missing: evalkit run --resume finishes it"
    else:
        state, line = "resumable", "stopped before it finished: evalkit run --resume finishes it"
    return {"status": state, "progress": fraction, "line": line}


def summary(root: Path, name: str) -> dict[str, Any]:
    path = run_path(root, name)
    manifest = RunDir.open(path).manifest()
    recommended = summary_text = None
    decision_file = path / DECISION_JSON
    if decision_file.is_file() and inside(path, decision_file):
        try:
            decision = json.loads(decision_file.read_text(encoding="utf-8"))
            recommended, summary_text = decision.get("recommended"), decision.get("summary")
        except (OSError, ValueError):
            summary_text = "(decision.json unreadable)"
    config_file = str(manifest.get("config_file") or "")
    return {
        "run_id": str(manifest.get("run_id", name)), "name": name, "created": manifest.get("created"),
        "config": Path(config_file).name if config_file else None,
        "deployments": [str(d) for d in manifest.get("deployment_order", [])],
        "reference": manifest.get("reference"), "recommended": recommended, "decision": summary_text,
        **status(path),
    }


def list_runs(root: Path) -> list[dict[str, Any]]:
    out = []
    for name in run_names(root):
        try:
            out.append(summary(root, name))
        except (NotFound, OSError, ValueError, KeyError) as e:
            out.append({"run_id": name, "name": name, "status": "unreadable", "line": f"{type(e).__name__}: {e}",
                        "deployments": []})
        except Exception as e:  # one broken run must not hide the others
            out.append({"run_id": name, "name": name, "status": "unreadable", "line": f"{type(e).__name__}: {e}",
                        "deployments": []})
    return out
