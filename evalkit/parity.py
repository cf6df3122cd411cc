"""Same tokens on both engines: compare each prompt's token ids across deployments of one source model.

A mismatch (BOS, chat template or tokenizer differences between a GGUF and its HF checkpoint) silently
invalidates likelihood comparisons, so it is reported per item.
"""
from __future__ import annotations

import json
from typing import Any

from evalkit.records import Record
from evalkit.suites.base import ScoreContext

_TOKEN_FIELDS = ("prompt_token_ids", "token_ids")


def _tokens(rec: Record) -> list[int] | None:
    for f in _TOKEN_FIELDS:
        ids = getattr(rec, f, None)
        if ids is not None:
            return list(ids)
    return None


def _first_diff(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def token_parity_rows(by_suite: dict[str, dict[str, list[Record]]], ctx: ScoreContext) -> list[dict[str, Any]]:
    """One row per (suite, item, deployment) whose prompt tokens differ from the reference's
    deployment of the same source model; plus one summary row per deployment pair."""
    sources = {name: d.get("source") for name, d in ctx.manifest["deployments"].items()}
    sampling = (ctx.manifest.get("config") or {}).get("sampling") or {}
    greedy = float(sampling.get("temperature", 0.0)) == 0.0  # outputs are comparable token by token only then
    ref = ctx.reference
    rows: list[dict[str, Any]] = []
    for suite, per_dep in by_suite.items():
        ref_recs = {r.item_id: _tokens(r) for r in per_dep.get(ref, [])}
        for dep, recs in per_dep.items():
            if dep == ref or sources.get(dep) is None or sources.get(dep) != sources.get(ref):
                continue  # different models have different tokenizers by design
            compared = mismatched = 0
            for r in recs:
                mine, theirs = _tokens(r), ref_recs.get(r.item_id)
                if mine is None or theirs is None:
                    continue
                compared += 1
                if mine != theirs:
                    mismatched += 1
                    at = _first_diff(mine, theirs)
                    rows.append({
                        "suite": suite, "item_id": r.item_id, "deployment": dep, "reference": ref,
                        "status": "mismatch", "first_difference_at": at,
                        "deployment_tokens": str(mine[max(0, at - 2): at + 3]),
                        "reference_tokens": str(theirs[max(0, at - 2): at + 3]),
                        "deployment_len": len(mine), "reference_len": len(theirs),
                    })
            if compared:
                rows.append({"suite": suite, "item_id": "*", "deployment": dep, "reference": ref,
                             "status": f"{compared - mismatched}/{compared} identical"})
            if greedy:
                rows += _output_rows(suite, dep, ref, recs, {r.item_id: r for r in per_dep.get(ref, [])},
                                     settings_differ(ctx, dep, ref))
    return rows


def _engine_settings(ctx: ScoreContext, dep: str) -> dict[str, Any] | None:
    """The settings that change greedy outputs of the same weights and prompt tokens (attention kernel, batch and
    KV-cache precision) that the deployment's engine info states (run_dir/engines/<deployment>.json `extra`; which
    ones: each engine's EngineSpec.info_numerics)."""
    from evalkit.engines import numeric_settings

    path = ctx.run_dir / "engines" / f"{dep}.json" if ctx.run_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        extra = json.loads(path.read_text(encoding="utf-8")).get("extra") or {}
    except (OSError, ValueError):
        return None
    return numeric_settings(extra)


def settings_differ(ctx: ScoreContext, dep: str, ref: str) -> str:
    """"flash_attn True vs False; n_batch 512 vs 2048": the settings both engines state and state differently
    ("" when none do, or either engine's info is missing)."""
    a, b = _engine_settings(ctx, dep), _engine_settings(ctx, ref)
    if a is None or b is None:
        return ""
    return "; ".join(f"{k} {a[k]} vs {b[k]}" for k in a if k in b and a[k] != b[k])


def _output_ids(rec: Record | None) -> list[int] | None:
    """The generated token ids of a record with a generation (records.Generation), else None."""
    gen = getattr(rec, "generation", None)
    return None if gen is None else gen.output_token_ids


def _output_rows(suite: str, dep: str, ref: str, recs: list[Record], ref_recs: dict[str, Record],
                 differ: str = "") -> list[dict[str, Any]]:
    """Greedy outputs of the same prompt tokens compared token by token (a served deployment against the same
    weights in-process, say): one summary row, and one row per item that differs, where it starts to differ.
    Differences come from numerics (batch shapes, kernels), since the prompt tokens are the same."""
    rows: list[dict[str, Any]] = []
    compared = same = 0
    for r in recs:
        theirs = ref_recs.get(r.item_id)
        mine_out, ref_out = _output_ids(r), _output_ids(theirs)
        if theirs is None or mine_out is None or ref_out is None or _tokens(r) != _tokens(theirs):
            continue
        compared += 1
        if list(mine_out) == list(ref_out):
            same += 1
            continue
        at = _first_diff(list(mine_out), list(ref_out))
        rows.append({"suite": f"{suite} (greedy outputs)", "item_id": r.item_id, "deployment": dep, "reference": ref,
                     "status": "output differs", "first_difference_at": at,
                     "deployment_tokens": str(list(mine_out)[max(0, at - 2): at + 3]),
                     "reference_tokens": str(list(ref_out)[max(0, at - 2): at + 3]),
                     "deployment_len": len(mine_out), "reference_len": len(ref_out)})
    if compared:
        # Where outputs diverge, the engine settings that differ are the first suspects: name them.
        why = f"; settings that differ: {differ}" if differ and same < compared else ""
        rows.append({"suite": f"{suite} (greedy outputs)", "item_id": "*", "deployment": dep, "reference": ref,
                     "status": f"{same}/{compared} identical{why}"})
    return rows
