"""Scores, comparisons and per-item tables from records alone. Never loads a model."""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

from evalkit.config import Config
from evalkit.records import Record, parse_record
from evalkit.spreadsheet import neutralize_cell
from evalkit.store import (  # the file names: re-exported for callers of evalkit.scoring
    COMPARISON_COLUMNS, COMPARISONS_CSV, ITEMS_DIR, SCORE_COLUMNS, SCORES_CSV, RunDir, atomic_write_text, rows_to_csv,
)
from evalkit.suites import enabled_suites
from evalkit.suites.base import ScoreContext


def records_by_suite(run: RunDir, deployments: list[str]) -> dict[str, dict[str, list[Record]]]:
    """suite -> deployment -> typed records (older layouts upgraded; a newer schema is refused)."""
    out: dict[str, dict[str, list[Record]]] = {}
    for dep in deployments:
        where = str(run.records_path(dep))
        for raw in run.records(dep):
            rec = parse_record({**raw, "deployment": raw.get("deployment") or dep}, where)
            out.setdefault(rec.suite, {}).setdefault(dep, []).append(rec)
    return out


def score_context(run: RunDir) -> tuple[ScoreContext, Config]:
    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    ctx = ScoreContext(
        deployments=list(manifest["deployment_order"]),
        reference=manifest["reference"],
        config=config,
        config_file=Path(manifest["config_file"]),
        manifest=manifest,
        run_dir=run.path,
    )
    return ctx, config


def score_run(run: RunDir) -> None:
    from evalkit.metrics.stats import scipy_memo

    ctx, _ = score_context(run)
    with scipy_memo(scipy_answers(ctx.manifest)):  # a re-run that scores the same records imports no scipy.stats
        _score(run, ctx)


def scipy_answers(manifest: dict[str, Any]) -> Path | None:
    """Where scoring keeps scipy's answers (evalkit.metrics.stats): the result cache's `scipy/`, for runs that
    use the cache."""
    if not manifest.get("use_cache"):
        return None
    from evalkit.models import cache_dir

    return cache_dir() / "scipy"


def _score(run: RunDir, ctx: ScoreContext) -> None:
    config = ctx.config
    by_suite = records_by_suite(run, ctx.deployments)
    scores, comparisons = [], []
    (run.path / ITEMS_DIR).mkdir(exist_ok=True)
    for suite in enabled_suites(config, ctx.config_file):
        records = by_suite.get(suite.name, {})
        if not records:
            continue
        print(f"evalkit: scoring {suite.name}", file=sys.stderr, flush=True)
        result = suite.scored(records, ctx)
        scores += result.scores
        comparisons += result.comparisons
        if result.items:
            atomic_write_text(run.path / ITEMS_DIR / f"{suite.name}.csv", _items_csv(result.items))
    # Imported human ratings are a suite like the others in the tidy tables (evalkit.rating.aggregate).
    from evalkit.rating.aggregate import tidy_rows

    rated_scores, rated_comps = tidy_rows(run.path)
    scores += rated_scores
    comparisons += rated_comps
    from evalkit.parity import token_parity_rows

    parity = token_parity_rows(by_suite, ctx)
    atomic_write_text(run.path / "parity.csv", _items_csv(parity) if parity else "")
    from evalkit.decision import annotate_comparisons, decide_from, rows_frame, write_decision

    try:
        decision = decide_from(config, ctx.config_file, ctx.manifest, rows_frame(scores), rows_frame(comparisons))
    except Exception as e:  # the decision must never cost the run its scores and report
        print(f"evalkit: warning: no decision made: {type(e).__name__}: {e}", file=sys.stderr)
        decision = None
    if decision is not None:
        comparisons = annotate_comparisons(decision, comparisons)
    write_decision(run.path, decision)
    atomic_write_text(run.path / SCORES_CSV, rows_to_csv(scores, SCORE_COLUMNS))
    atomic_write_text(run.path / COMPARISONS_CSV, rows_to_csv(comparisons, COMPARISON_COLUMNS))


def _items_csv(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    w.writeheader()
    for r in rows:
        w.writerow({k: neutralize_cell(v) for k, v in r.items()})
    return "\ufeff" + buf.getvalue()  # BOM: Excel then reads UTF-8 (Chinese references) correctly
