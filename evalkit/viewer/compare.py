"""Run against run: paired differences over the items two runs share, by the suites' own compare().

Each pairing is (a deployment of the candidate run, a deployment of the baseline run; by default the
deployments of the same name). Its records, restricted to the items both sides have, go to a fresh
instance of each suite's `compare()` with the baseline side as the reference: the very code, statistics
(evalkit.metrics.stats via metrics.compare) and settings that wrote comparisons.csv, so pairing a
deployment with a run's own reference gives exactly that run's comparisons.csv row. The items whose
pass/fail outcome changed between the runs come from both runs' indexes.
"""
from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from evalkit.scoring import records_by_suite, score_context
from evalkit.sidefiles import SideFile, side_path
from evalkit.store import RunDir
from evalkit.suites import enabled_suites, suite_spec
from evalkit.suites.base import ScoreContext
from evalkit.viewer.index import IndexCache
from evalkit.viewer.safety import inside

MAX_CHANGED = 500
# Settings that only choose how many items run (a bigger run shares its first items with a smaller one).
SIZE_SETTINGS = {"limit", "limit_per_category", "max_chunks", "per_subject", "lengths", "depths", "categories",
                 "subjects", "repeats", "concurrency"}  # items listed per pairing (counts are always complete)


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def default_pairs(candidate: list[str], baseline: list[str]) -> list[tuple[str, str]]:
    return [(d, d) for d in candidate if d in baseline]


def compare_runs(candidate: Path, baseline: Path, pairs: list[tuple[str, str]], cache: IndexCache) -> dict[str, Any]:
    """Comparison rows (candidate side minus baseline side) and changed outcomes for each pairing."""
    cand_run, base_run = RunDir.open(candidate), RunDir.open(baseline)
    ctx, config = score_context(cand_run)
    base_manifest = base_run.manifest()
    cand_recs = records_by_suite(cand_run, ctx.deployments)
    base_recs = records_by_suite(base_run, [str(d) for d in base_manifest["deployment_order"]])
    cand_index, base_index = cache.get(candidate), cache.get(baseline)
    cand_id, base_id = ctx.manifest["run_id"], base_manifest["run_id"]
    stats_differ = (base_manifest.get("config") or {}).get("stats") != (ctx.manifest.get("config") or {}).get("stats")
    from evalkit.history import result_keys

    keys = (result_keys(candidate, ctx.manifest), result_keys(baseline, base_manifest))  # what each result depends on
    out: list[dict[str, Any]] = []
    for dep, base_dep in pairs:
        mine, theirs = f"{dep} @ {cand_id}", f"{base_dep} @ {base_id}"
        rows: list[dict[str, Any]] = []
        errors: list[str] = []
        shared_total = 0
        for suite in enabled_suites(config, ctx.config_file):  # fresh instances: suites memoise per scoring pass
            if not suite_spec(suite.name).viewer.items:  # not items (cost): nothing to compare item by item
                continue
            differ = _differing_settings(ctx.manifest, base_manifest, suite.name)
            if differ:
                errors.append(f"{suite.name}: not compared, its settings differ between the runs ({', '.join(differ)}): "
                              "the same item id may not be the same item")
                continue
            a = cand_recs.get(suite.name, {}).get(dep, [])
            b = base_recs.get(suite.name, {}).get(base_dep, [])
            shared = {r.item_id for r in a} & {r.item_id for r in b}
            if not shared:
                continue
            shared_total += len(shared)
            # Each side's side files come from its own run directory (records v2), carried in memory by the record.
            records = {theirs: carrying_arrays([r for r in b if r.item_id in shared], baseline),
                       mine: carrying_arrays([r for r in a if r.item_id in shared], candidate)}
            deployments = {**{k: v for k, v in (ctx.manifest.get("deployments") or {}).items()}}
            sctx = ScoreContext(deployments=[theirs, mine], reference=theirs, config=config, config_file=ctx.config_file,
                                manifest={**ctx.manifest, "deployment_order": [theirs, mine], "reference": theirs,
                                          "deployments": {theirs: (base_manifest.get("deployments") or {}).get(base_dep, {}),
                                                          mine: deployments.get(dep, {})}})
            try:
                comps = suite.compare(records, sctx)
            except Exception as e:  # one suite that cannot pair across runs must not hide the others
                errors.append(f"{suite.name}: {type(e).__name__}: {e}")
                continue
            for c in comps:
                row = {k: _clean(v) for k, v in asdict(replace(c, deployment=dep, reference=base_dep)).items()}
                row["shared_items"] = len(shared)
                rows.append(row)
        out.append({"deployment": dep, "baseline_deployment": base_dep, "rows": rows, "errors": errors,
                    "shared_items": shared_total, "what_changed": _what_changed(keys[0].get(dep, {}), keys[1].get(base_dep, {})),
                    **_changed(cand_index, base_index, dep, base_dep)})
    return {"candidate": cand_id, "baseline": base_id, "pairs": out,
            "note": ("the two runs' configs set different `stats:`; intervals use the candidate's" if stats_differ else ""),
            "candidate_deployments": ctx.deployments,
            "baseline_deployments": [str(d) for d in base_manifest["deployment_order"]]}


def _what_changed(mine: dict[str, dict[str, str]], theirs: dict[str, dict[str, str]]) -> str:
    """What a pairing's results depend on that differs between its two sides (evalkit.history's keys of each
    suite both ran, as `evalkit diff` says it)."""
    from evalkit.history import key_changes, summarize_changes

    seen: dict[str, dict[str, Any]] = {}
    for suite in mine.keys() & theirs.keys():
        for c in key_changes(theirs[suite], mine[suite], suite):
            seen.setdefault(c["field"], c)
    return summarize_changes(list(seen.values())) if mine.keys() & theirs.keys() else "no suite run by both"


def carrying_arrays(records: list[Any], run_dir: Path) -> list[Any]:
    """The records, each that names a side file holding its bytes (`side_file`), read from `run_dir`: the two
    sides of a comparison live in two run directories, and a suite reads arrays from one at most."""
    out = []
    for r in records:
        sha = getattr(r, "arrays_sha256", None)
        if sha and getattr(r, "side_file", None) is None:
            path = side_path(run_dir, sha)
            if inside(run_dir, path) and path.is_file():
                r = r.model_copy(update={"side_file": SideFile(sha, path.read_bytes())})
        out.append(r)
    return out


def _differing_settings(a: dict[str, Any], b: dict[str, Any], suite: str) -> list[str]:
    """Settings of `suite` that differ between two runs' configs, sample sizes aside (fewer or more items of the
    same kind still pair by id); a suite only one run has is left to the shared-items rule."""
    sa = ((a.get("config") or {}).get("suites") or {}).get(suite)
    sb = ((b.get("config") or {}).get("suites") or {}).get(suite)
    if not isinstance(sa, dict) or not isinstance(sb, dict):
        return []
    return sorted(k for k in set(sa) | set(sb) if k not in SIZE_SETTINGS and sa.get(k) != sb.get(k))


def _changed(cand: Any, base: Any, dep: str, base_dep: str) -> dict[str, Any]:
    """Items whose pass/fail outcome differs between the runs, and how many outputs changed at all."""
    changed: list[dict[str, Any]] = []
    n_changed = n_text = 0
    if dep not in cand.cols or base_dep not in base.cols:
        return {"changed": [], "n_changed": 0, "n_output_changed": 0}
    mine, theirs = cand.cols[dep], base.cols[base_dep]
    for key, i in cand.row_of.items():
        j = base.row_of.get(key)
        if j is None or not mine.has[i] or not theirs.has[j]:
            continue
        a, b = mine.value[i], theirs.value[j]
        if a is not None and b is not None and a != b:
            n_text += 1
        now, before = int(mine.ok[i]), int(theirs.ok[j])
        if now >= 0 and before >= 0 and now != before:
            n_changed += 1
            if len(changed) < MAX_CHANGED:
                changed.append({"suite": key[0], "item_id": key[1], "category": cand.category[i],
                                "before": "pass" if before else "fail", "after": "pass" if now else "fail"})
    return {"changed": changed, "n_changed": n_changed, "n_output_changed": n_text}
