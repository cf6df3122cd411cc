"""The report's tables per section, built once from what scoring wrote; render.py prints them as HTML and
Markdown. Nothing is recomputed here: values, intervals and significance come from scores.csv,
comparisons.csv, items/<suite>.csv, parity.csv, the ratings aggregate and the manifest.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from evalkit.capabilities import grouped_skips
from evalkit.report.cells import (
    Cell, Table, fmt, fmt_interval, isnum, plain, spec_for,
)
from evalkit.report.view import RunView, measured_peak
from evalkit.suites import SUITES, SuiteSpec, load_hook, suite_spec


# -- suite tables ------------------------------------------------------------------------------


def metric_table(view: RunView, key: str, title: str, columns: list[tuple[str, str, str, str]], caption: str = "") -> Table:
    """Rows = deployments; columns = (label, suite, category, metric); cells with difference and mark."""
    present = [c for c in columns if any(view.score(d, *c[1:]) is not None for d in view.deployments)]
    rows = [[Cell(d, "(reference)" if d == view.reference else "")] + [view.cell(d, *c[1:]) for c in present]
            for d in view.deployments]
    return Table(key, title, ["deployment"] + [c[0] for c in present], rows if present else [], caption, numeric=True)


def declared_metrics_table(view: RunView, spec: SuiteSpec) -> Table:
    """A suite without a section of its own: each declared metric it scored, per category, one row per deployment."""
    s = view.suite_scores(spec.name)
    cats = sorted({str(c) for c in s.category}) if not s.empty else []
    cols = [(f"{m.name} ({c})" if len(cats) > 1 else m.name, spec.name, c, m.name) for m in spec.metrics for c in cats]
    return metric_table(view, f"{spec.name}-scores", spec.label, cols)


def flips_table(view: RunView, suite: str, category: str, unit: str) -> Table:
    rows = []
    for dep in view.deployments:
        if dep == view.reference:
            continue
        rate = view.comp(dep, suite, category, "flip_rate")
        if rate is None:
            continue
        n = int(rate["n"])
        k = {m: round(float(r["value"]) * n) if (r := view.comp(dep, suite, category, m)) is not None else 0
             for m in ("flips_right_to_wrong", "flips_wrong_to_right")}
        kind = spec_for(suite, "flip_rate").kind
        rows.append([Cell(dep), plain(n), Cell(fmt(rate["value"], kind), fmt_interval(rate["ci_low"], rate["ci_high"], kind)),
                     plain(k["flips_right_to_wrong"]), plain(k["flips_wrong_to_right"]),
                     Cell(f"{float(rate['p_value']):.3g}" if isnum(rate.get("p_value")) else "–")])
    return Table(f"{suite}-flips", f"Answers that changed against the reference ({unit})",
                 ["deployment", unit, "flipped", "✓→✗ (reference right)", "✗→✓ (reference wrong)", "McNemar p"], rows,
                 "A small p means the flips go mostly one way: a real change, not noise.")


def flipped_items(view: RunView, suite: str, shown: tuple[str, ...], limit: int = 40) -> Table:
    """The items whose pass/fail flipped against the reference, with the per-item CSV's columns `shown` (a
    multiple-choice letter and the gold one; for code, too long for a table, its sandbox status and detail)."""
    items = view.items(suite)
    if items.empty or "flip" not in items:
        return Table(f"{suite}-flipped", "", [], [])
    f = items[items.flip.fillna("").astype(str) != ""]
    wanted = ("item_id", "deployment", "flip") + shown
    cols = [c for c in wanted if c in f]
    rows = [[plain(r[c]) for c in cols] for _, r in f.head(limit).iterrows()]
    more = f" (first {limit} of {len(f)})" if len(f) > limit else ""
    return Table(f"{suite}-flipped", f"Flipped items{more}", cols, rows)


# -- cost and memory -----------------------------------------------------------------------------


def _gb(n: int | None, estimate: bool | None = False) -> str:
    """Bytes as GB (10^9); a size the ledger could not know stays "unknown", never 0."""
    return "unknown" if n is None else ("~" if estimate else "") + f"{n / 1e9:.2f} GB"


def cached_suites(view: RunView, dep: str) -> list[str]:
    """The suites whose every record of `dep` came from the engine-result cache: their work did not run in this
    run, so a memory peak measured here does not cover it (the plan sizes every enabled suite's workload)."""
    all_cached: dict[str, bool] = {}
    for rec in view.run.run_dir.records(dep):
        suite = str(rec.get("suite"))
        all_cached[suite] = all_cached.get(suite, True) and bool(rec.get("cached"))
    return sorted(s for s, cached in all_cached.items() if cached)


def ledger_table(view: RunView) -> Table:
    """The memory ledger's prediction beside the measured peak (when both exist: `view.measured_peak`). A peak
    measured while some suites were answered from the cache covers only what ran: the ratio says so."""
    ledger = view.run.manifest.get("ledger") or []
    rows = []
    gb = 1e9
    for r in ledger:
        peak = measured_peak(view, r["deployment"])
        predicted = r.get("per_device_bytes")
        ratio = f"{peak[0] / predicted:.2f}" if peak and predicted else "–"  # bytes / bytes
        skipped = cached_suites(view, r["deployment"]) if peak else []
        if skipped:
            ratio += f" (partial: {', '.join(skipped)} answered from the cache, not in this peak)"
        rows.append([Cell(r["deployment"]), Cell(str(r.get("precision", "–"))), Cell(str(r.get("devices", "–"))),
                     Cell(_gb(r.get("weights_bytes"), r.get("estimate"))), Cell(_gb(r.get("kv_bytes"))),
                     Cell(_gb(predicted, r.get("estimate"))), Cell({True: "yes", False: "NO", None: "unknown"}[r.get("fits")]),
                     Cell(f"{peak[0] / gb:.2f} GB ({peak[1]})" if peak else "not measured"), Cell(ratio),
                     Cell(str(r.get("notes", "")))])
    return Table("ledger", "Memory ledger: predicted before loading vs measured", [
        "deployment", "precision", "devices", "weights", "KV cache", "predicted per device", "fits", "measured peak",
        "measured / predicted", "notes"], rows,
        "GB = 10⁹ bytes. An engine that reserves its share of a device up front has a measured peak that tracks the reservation.")


# -- what ran where --------------------------------------------------------------------------


def hardware_table(view: RunView) -> Table:
    rows = []
    ran = _engine_extras(view)
    for name in view.deployments:
        dep = view.run.manifest["deployments"][name]
        hw = dep.get("hardware") or {}
        notes = "; ".join([hw.get("explanation") or ""] + list(hw.get("notes") or []))
        rows.append([Cell(name), Cell(dep.get("engine", "–")), Cell(str(dep.get("source", "–"))),
                     Cell(str(dep.get("variant") or "–")), Cell(str(hw.get("requested_quantization") or "none")),
                     Cell(str(hw.get("effective_precision", "–"))), Cell(str(hw.get("device", "–"))),
                     Cell(_kernel_cell(hw, ran.get(name) or {})), Cell(notes.strip("; "))])
    return Table("hardware", "", ["deployment", "engine", "model", "variant", "requested",
                                  "effective precision", "device", "linear kernel: planned / ran", "explanation"], rows,
                 "Linear kernel: the plan's prediction (from the engine's code, as its rules cite it) beside the kernel classes the loaded engine's "
                 "layers really ran (read from the model, engines/<deployment>.json); 'differs' when they disagree.")


def _engine_extras(view: RunView) -> dict[str, dict[str, Any]]:
    e = view.run.engines
    if e.empty or "deployment" not in e or "extra" not in e:
        return {}
    return {str(r["deployment"]): r["extra"] for r in e.to_dict("records") if isinstance(r.get("extra"), dict)}


def _kernel_cell(hw: dict[str, Any], extra: dict[str, Any]) -> str:
    planned = hw.get("planned_kernel") or ("refused: " + hw["planned_kernel_refused"] if hw.get("planned_kernel_refused") else None)
    ran = extra.get("linear_kernel") or (f"not read ({extra['linear_kernels_error']})" if extra.get("linear_kernels_error") else None)
    if planned is None and ran is None:
        return "–"
    agree = "" if planned is None or ran is None else (" (as planned)" if str(ran).startswith(str(planned)) else " (differs)")
    return f"{planned or 'no prediction'} / {ran or 'not recorded'}{agree}"


def warnings(view: RunView) -> list[tuple[str, str]]:
    out = []
    for name in view.deployments:
        w = ((view.run.manifest["deployments"].get(name) or {}).get("hardware") or {}).get("warning")
        if w:
            out.append((name, str(w)))
    # Pairs the plan skipped: the deployment's engine lacks a capability the suite needs, or its own `suites:`
    # list leaves the suite out (`chosen`).
    skipped = view.run.manifest.get("skipped", [])
    out += [(s["deployment"], f"suite {s['suite']} skipped: {s['reason']}") for s in skipped if not s.get("chosen")]
    chosen = grouped_skips(s for s in skipped if s.get("chosen"))
    out += [(dep, f"does not run {', '.join(suites)}: {reason}") for (dep, reason), suites in chosen.items()]
    return out


def parity_tables(view: RunView) -> list[Table]:
    path = view.run.path / "parity.csv"
    if not path.exists() or path.stat().st_size == 0:
        return []
    p = pd.read_csv(path, encoding="utf-8-sig")
    if p.empty:
        return []
    summary = p[p.item_id.astype(str) == "*"]
    out = [Table("parity", "Token parity: same prompt tokens as the reference's deployment of the same model",
                 ["suite", "deployment", "reference", "identical"],
                 [[Cell(r.suite), Cell(r.deployment), Cell(r.reference), Cell(str(r.status))] for r in summary.itertuples()],
                 "Only deployments of the same source model are compared; a mismatch (template, BOS, tokenizer) "
                 "makes likelihood comparisons of that item invalid.")]
    mism = p[p.status.astype(str) == "mismatch"]
    if not mism.empty:
        cols = ["suite", "item_id", "deployment", "first_difference_at", "deployment_tokens", "reference_tokens",
                "deployment_len", "reference_len"]
        out.append(Table("parity-mismatch", f"Items whose prompt tokens differ ({len(mism)})", cols,
                         [[plain(r[c]) for c in cols] for _, r in mism.head(40).iterrows()]))
    return out


def engines_table(view: RunView) -> Table:
    e = view.run.engines
    rows = []
    if not e.empty:
        order = {d: i for i, d in enumerate(view.deployments)}
        for r in sorted(e.to_dict("records"), key=lambda r: order.get(r.get("deployment"), len(order))):
            template = r.get("chat_template")
            rows.append([Cell(str(r.get("deployment"))), Cell(f"{r.get('engine')} {r.get('engine_version')}"),
                         Cell(str(template) if template else "none (plain completion)"),
                         Cell("yes" if r.get("add_bos") else "no"), Cell(fmt(r.get("bos_token_id"))),
                         Cell(fmt(r.get("n_ctx"), "count")), Cell(fmt(r.get("load_s"), "s"))])
    return Table("engines", "Engines", ["deployment", "engine", "chat template", "BOS added", "BOS id", "n_ctx",
                                        "load time"], rows)


def environment_table(view: RunView) -> Table:
    m = view.run.manifest
    env = m.get("environment") or {}
    rows = [[Cell("evalkit"), Cell(str(m.get("evalkit_version", "–")))]]
    for k, v in (env.get("machine") or {}).items():
        rows.append([Cell(k), Cell(f"{v / 1e9:.1f} GB" if k == "ram_bytes" and isnum(v) else str(v))])
    for a in env.get("accelerators") or []:
        cap = a.get("capability")
        rows.append([Cell(f"accelerator {a.get('index')}"),
                     Cell(f"{a.get('name')}" + (f", capability {cap[0]}.{cap[1]}" if cap else "")
                          + (f", {a['memory_bytes'] / 2**30:.0f} GiB" if isnum(a.get("memory_bytes")) else ""))])
    libs = ", ".join(f"{k} {v}" for k, v in (env.get("libraries") or {}).items() if v)
    rows.append([Cell("libraries"), Cell(libs)])
    sampling = (m.get("config") or {}).get("sampling") or {}
    rows.append([Cell("sampling"), Cell(", ".join(f"{k} {v}" for k, v in sampling.items()))])
    rows.append([Cell("config"), Cell(str(m.get("config_file", "–")))])
    return Table("environment", "Environment", ["", ""], rows)


def signatures_table(view: RunView) -> Table:
    rows = []
    for suite, info in view.suite_info.items():  # each suite's describe(), through its own hook if it has one
        spec = suite_spec(suite) if suite in SUITES else None
        if spec is not None and spec.signatures is not None:
            rows += [[Cell(k), Cell(v)] for k, v in load_hook(spec.signatures)(view, info)]
            continue
        for k, v in flatten(info):
            rows.append([Cell(f"{suite} · {k}"), Cell(v)])
    return Table("signatures", "Signatures and provenance", ["what", "value"], rows,
                 "Everything needed to reproduce a number: metric signatures, data files and their hashes, methods.")


def flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) of each leaf of a describe() dict; long lists cut."""
    if isinstance(d, dict):
        out = []
        for k, v in d.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(d, list):
        text = ", ".join(map(str, d))
        return [(prefix, text if len(text) <= 300 else text[:300] + f"… ({len(d)} entries)")]
    return [(prefix, str(d))]


def all_numbers(view: RunView) -> list[Table]:
    """scores.csv and comparisons.csv in full, for tracing any number in the report."""
    out = []
    if not view.comps.empty:
        cols = ["deployment", "suite", "category", "metric", "value", "reference_value", "diff", "ci_low", "ci_high",
                "p_value", "n", "method", "significant"]
        out.append(Table("all-comparisons", "Every paired comparison (comparisons.csv)", cols,
                         [[plain(r[c]) for c in cols] for _, r in view.comps.iterrows()]))
    if not view.scores.empty:
        cols = ["deployment", "suite", "category", "metric", "value", "ci_low", "ci_high", "n"]
        out.append(Table("all-scores", "Every score (scores.csv)", cols,
                         [[plain(r[c]) for c in cols] for _, r in view.scores.iterrows()]))
    return out
