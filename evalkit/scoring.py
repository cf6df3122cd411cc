"""Scores, comparisons and per-item tables from records alone. Never loads a model."""
from __future__ import annotations

import csv
import gc
import io
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from evalkit.config import Config
from evalkit.records import Record, parse_current_line, parse_record
from evalkit.spreadsheet import neutralize_cell
from evalkit.store import (  # the file names: re-exported for callers of evalkit.scoring
    COMPARISON_COLUMNS, COMPARISONS_CSV, ITEMS_DIR, SCORE_COLUMNS, SCORES_CSV, RunDir, atomic_write_text, rows_to_csv,
)
from evalkit.store import json_line, line_head, record_key
from evalkit.suites import scored_suites, suite_spec
from evalkit.suites.base import ScoreContext


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the block (its previous state back after). Reading a run makes tens of
    thousands of records, none in a reference cycle (reference counting frees them), and every collection the
    allocations trigger walks all of them again: with it on, 20,000 items x 4 files spent ~1.5 s in collections."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def records_by_suite(run: RunDir, deployments: list[str]) -> dict[str, dict[str, list[Record]]]:
    """suite -> deployment -> typed records (older layouts upgraded; a newer schema is refused)."""
    with paused_gc():
        return _records_by_suite(run, deployments)


def _records_by_suite(run: RunDir, deployments: list[str]) -> dict[str, dict[str, list[Record]]]:
    out: dict[str, dict[str, list[Record]]] = {}
    for dep in deployments:
        path = run.records_path(dep)
        where = str(path)
        seen: set[str] = set()  # an item recorded twice: the first line wins (RunDir.records)
        for n, line in run.record_lines(dep):
            rec = parse_current_line(line, line_head(line))
            if rec is None:  # an older layout or a line that does not validate: the dict path names the problem
                raw = json_line(path, n, line)
                key = record_key(raw["suite"], raw["item_id"])
                if key in seen:
                    continue
                seen.add(key)
                rec = parse_record({**raw, "deployment": raw.get("deployment") or dep}, where)
            else:
                key = record_key(rec.suite, rec.item_id)
                if key in seen:
                    continue
                seen.add(key)
                if not rec.deployment:
                    rec = rec.model_copy(update={"deployment": dep})
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
    ctx, _ = score_context(run)
    _score(run, ctx)


def _score(run: RunDir, ctx: ScoreContext) -> None:
    config = ctx.config
    by_suite = records_by_suite(run, ctx.deployments)
    scores, comparisons = [], []
    (run.path / ITEMS_DIR).mkdir(exist_ok=True)
    # Every suite through its spec, in registry order: those the config ran, from their records; those scored from
    # the run directory's own files (SuiteSpec.runs False: imported human ratings, a model judge's answers), from them.
    for suite in scored_suites(config, ctx.config_file):
        records = by_suite.get(suite.name, {})
        runs = suite_spec(suite.name).runs
        if runs and not records:
            continue
        if runs:
            print(f"evalkit: scoring {suite.name}", file=sys.stderr, flush=True)
        result = suite.scored(records, ctx)
        scores += result.scores
        comparisons += result.comparisons
        if result.items:
            atomic_write_text(run.path / ITEMS_DIR / f"{suite.name}.csv", _items_csv(result.items))
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
