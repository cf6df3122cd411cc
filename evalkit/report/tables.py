"""The report's tables per section, built once from what scoring wrote; render.py prints them as HTML and
Markdown. Nothing is recomputed here: values, intervals and significance come from scores.csv,
comparisons.csv, items/<suite>.csv, parity.csv, the ratings aggregate and the manifest.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from evalkit.capabilities import grouped_skips
from evalkit.report.cells import (
    CATEGORIES, CATEGORY_LABEL, Cell, Table, cell, fmt, fmt_interval, isnum, plain, signed, spec_for,
)
from evalkit.report.verdict import human_cell, kld_kind, translation_langs
from evalkit.report.view import RunView, bleu_signatures, measured_peak


# -- suite tables ------------------------------------------------------------------------------


def metric_table(view: RunView, key: str, title: str, columns: list[tuple[str, str, str, str]], caption: str = "") -> Table:
    """Rows = deployments; columns = (label, suite, category, metric); cells with difference and mark."""
    present = [c for c in columns if any(view.score(d, *c[1:]) is not None for d in view.deployments)]
    rows = [[Cell(d, "(reference)" if d == view.reference else "")] + [view.cell(d, *c[1:]) for c in present]
            for d in view.deployments]
    return Table(key, title, ["deployment"] + [c[0] for c in present], rows if present else [], caption, numeric=True)


def prompts_table(view: RunView) -> Table:
    cols = [("code pass@1", "prompts", "code", "pass@1"),
            ("reasoning correct", "prompts", "reasoning", "contains"),
            ("QA correct", "prompts", "qa", "contains")]
    for lang in translation_langs(view, "bleu_en-"):
        cols += [(f"BLEU en-{lang}", "prompts", "translation", f"bleu_en-{lang}"),
                 (f"chrF en-{lang}", "prompts", "translation", f"chrf_en-{lang}")]
    cols.append(("output tokens (mean)", "prompts", "all", "output_tokens_mean"))
    return metric_table(view, "prompts-scores", "Automatic scores by category", cols,
                        "“correct”: a gold answer appears in the output (exact match is in All numbers). "
                        "Code runs its tests in the sandbox.")


def perplexity_table(view: RunView) -> Table:
    cols = [("PPL", "ppl"), ("bits/byte", "bits_per_byte"), ("KLD mean", "kld_mean"), ("KLD median", "kld_median"),
            ("KLD p90", "kld_p90"), ("KLD p99", "kld_p99"), ("KLD max", "kld_max"),
            ("top-1 agreement", "top1_agreement"), ("Δp RMS", "delta_p_rms"), ("tokens", "n_tokens")]
    return metric_table(view, "perplexity-scores", "Perplexity and drift from the reference",
                        [(label, "perplexity", "text", m) for label, m in cols],
                        kld_caption(view) + " PPL ± is llama-perplexity's (tokens as independent draws).")


def kld_caption(view: RunView) -> str:
    """Which deployments' KLD is exact (against whom), which a lower bound, and how low the bound read where
    both exist."""
    exact: dict[str, list[str]] = {}  # "exact against X" -> deployments
    bound, bias = [], []
    for d in view.deployments:
        kind = kld_kind(view, d)
        if kind.startswith("exact"):
            exact.setdefault(kind, []).append(d)
        elif kind:
            bound.append(f"{d} ({kind.removeprefix('lower bound').lstrip(', ')})")
        b = view.score(d, "perplexity", "text", "kld_bound_bias")
        if b is not None and isnum(b["value"]):
            bias.append((d, float(b["value"])))
    parts = ["KLD is KL(reference ‖ deployment) per token."]
    for kind, deps in exact.items():
        parts.append(f"Exact over the full vocabulary for {', '.join(deps)} ({kind}: its distributions stored once, "
                     "each deployment compared token by token).")
    if bound:
        k = view.suite_info.get("perplexity", {}).get("top_k", "k")
        text = (f"A lower bound for {', '.join(bound)}: top-{k} log-probabilities plus one tail bucket, where a pair "
                "cannot give exact KLD (an engine without full distributions, or the KLD reference itself against "
                "the reference)")
        if bias:
            text += "; on this run's exact pairs the same top-k bound reads " + ", ".join(
                f"{100 * b:.1f}% low for {d}" for d, b in bias)
        else:
            measured = view.suite_info.get("perplexity", {}).get("kld_bias")
            text += f"; {measured}" if measured else ""
        parts.append(text + ".")
    return " ".join(parts)


# llama.cpp's `llama-perplexity --kl-divergence` output, row by row: (label, metric, declared format).
LLAMA_BLOCK = (
    ("Mean PPL(Q)", "ppl", "num"), ("Cor(ln PPL(Q), ln PPL(base))", "nll_correlation", "pct"),
    ("Mean ln(PPL(Q)/PPL(base))", "ln_ppl_ratio", "num"), ("Mean PPL(Q)/PPL(base)", "ppl_ratio", "num"),
    ("Mean PPL(Q)-PPL(base)", "ppl_diff", "num"),
    ("Mean KLD", "kld_mean", "num"), ("Maximum KLD", "kld_max", "num"), ("99.9% KLD", "kld_p99_9", "num"),
    ("99.0% KLD", "kld_p99", "num"), ("95.0% KLD", "kld_p95", "num"), ("90.0% KLD", "kld_p90", "num"),
    ("Median KLD", "kld_median", "num"), ("10.0% KLD", "kld_p10", "num"), ("5.0% KLD", "kld_p5", "num"),
    ("1.0% KLD", "kld_p1", "num"), ("0.1% KLD", "kld_p0_1", "num"), ("Minimum KLD", "kld_min", "num"),
    ("Mean Δp", "delta_p_mean", "pct"), ("Maximum Δp", "delta_p_max", "pct"), ("99.9% Δp", "delta_p_p99_9", "pct"),
    ("99.0% Δp", "delta_p_p99", "pct"), ("95.0% Δp", "delta_p_p95", "pct"), ("90.0% Δp", "delta_p_p90", "pct"),
    ("75.0% Δp", "delta_p_p75", "pct"), ("Median Δp", "delta_p_median", "pct"), ("25.0% Δp", "delta_p_p25", "pct"),
    ("10.0% Δp", "delta_p_p10", "pct"), ("5.0% Δp", "delta_p_p5", "pct"), ("1.0% Δp", "delta_p_p1", "pct"),
    ("0.1% Δp", "delta_p_p0_1", "pct"), ("Minimum Δp", "delta_p_min", "pct"), ("RMS Δp", "delta_p_rms", "pct"),
    ("Same top p", "top1_agreement", "pct"),
)


def llama_block_table(view: RunView) -> Table:
    """llama.cpp's statistics block, one column per deployment, so the two outputs read side by side."""
    deps = [d for d in view.deployments if view.score(d, "perplexity", "text", "kld_mean") is not None]
    rows = []
    for label, metric, kind in LLAMA_BLOCK:
        cells = []
        for d in deps:
            r = view.score(d, "perplexity", "text", metric)
            if r is None or not isnum(r["value"]):
                cells.append(Cell("–"))
                continue
            interval = fmt_interval(r["ci_low"], r["ci_high"], kind) if isnum(r.get("ci_low")) else ""
            cells.append(Cell(fmt(r["value"], kind), interval))
        if any(c.value != "–" for c in cells):
            rows.append([Cell(label)] + cells)
    if deps:
        rows.append([Cell("KLD")] + [Cell(kld_kind(view, d) or "lower bound") for d in deps])
    ref = view.score(view.reference, "perplexity", "text", "ppl")
    base = f"PPL(base) = {fmt(ref['value'], 'num')} ({view.reference}). " if ref is not None else ""
    return Table("perplexity-llama-block", "Statistics block as llama-perplexity --kl-divergence prints it",
                 ["statistic"] + deps, rows,
                 base + "PPL ratios are against it; KLD, Δp and same top p against the deployment the KLD row names. "
                 "Intervals are the run's (1 − alpha) normal intervals (llama.cpp prints ± one SE). "
                 "Percentiles interpolate linearly, as llama.cpp.", numeric=True)


def mmlu_subject_table(view: RunView) -> Table:
    """Rows = subjects (then all); one column per deployment: accuracy [CI] and its difference."""
    s = view.suite_scores("mmlu")
    if s.empty:
        return Table("mmlu-subjects", "", [], [])
    subjects = sorted({str(c) for c in s[s.metric == "accuracy"].category if str(c) != "all"}) + ["all"]
    rows = [[Cell(sub.replace("_", " "))] + [view.cell(d, "mmlu", sub, "accuracy") for d in view.deployments]
            for sub in subjects]
    return Table("mmlu-subjects", f"{view.mmlu_label} accuracy by subject", ["subject"] + list(view.deployments), rows,
                 f"Accuracy with Wilson {view.level} intervals; differences: exact McNemar test and the interval that "
                 "inverts it (hover for the paired bootstrap interval).",
                 numeric=True)


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


def flipped_items(view: RunView, suite: str = "mmlu", limit: int = 40) -> Table:
    items = view.items(suite)
    if items.empty or "flip" not in items:
        return Table(f"{suite}-flipped", "", [], [])
    f = items[items.flip.fillna("").astype(str) != ""]
    # MMLU's output is a letter; HumanEval's is code, too long for a table: its status and detail say enough.
    wanted = ("item_id", "deployment", "flip") + (("reference_pred", "output", "gold") if suite == "mmlu" else ("status", "detail"))
    cols = [c for c in wanted if c in f]
    rows = [[plain(r[c]) for c in cols] for _, r in f.head(limit).iterrows()]
    more = f" (first {limit} of {len(f)})" if len(f) > limit else ""
    return Table(f"{suite}-flipped", f"Flipped items{more}", cols, rows)


def longcontext_tables(view: RunView) -> list[Table]:
    s = view.suite_scores("longcontext")
    if s.empty:
        return []
    lengths = sorted({str(c) for c in s.category if str(c).startswith("L")}, key=lambda c: int(c[1:]))
    out = []
    for metric, title in (("seq_rep_4", "Repetition (seq-rep-4) by context length"),
                          ("distinct_2", "Distinct bigrams (distinct-2) by context length"),
                          ("recall_accuracy", "Pass-key recall by context length")):
        cols = [(f"{c[1:]} tokens", "longcontext", c, metric) for c in lengths]
        if metric == "recall_accuracy":
            cols.append(("all lengths", "longcontext", "all", metric))
        t = metric_table(view, f"longcontext-{metric}", title, cols)
        if not t.empty:
            out.append(t)
    skipped = s[s.metric == "skipped_items"]
    if not skipped.empty:
        rows = [[Cell(r.deployment), Cell(f"{str(r.category)[1:]} tokens"), plain(int(r.value))] for r in skipped.itertuples()]
        out.append(Table("longcontext-skipped", "Lengths not run", ["deployment", "length", "items skipped"], rows,
                         "The prompt plus the tokens to generate did not fit the engine's context (n_ctx)."))
    return out


def humaneval_table(view: RunView) -> Table:
    return metric_table(view, "humaneval-scores", "HumanEval pass@1", [("pass@1", "humaneval", "code", "pass@1")],
                        "Plain completion of each task prompt, run against its tests in the sandbox.")


# -- cost and memory -----------------------------------------------------------------------------


def _levels(view: RunView) -> list[str]:
    s = view.suite_scores("cost")
    return sorted({str(c) for c in s.category if str(c).startswith("c")}, key=lambda c: int(c[1:])) if not s.empty else []


def cost_tables(view: RunView) -> list[Table]:
    levels = _levels(view)
    if not levels:
        return []
    out = []
    for metric, title in (
        ("per_request_tokens_per_s", "Output tokens/s per request, by concurrent requests"),
        ("tokens_per_s", "Output tokens/s, all requests together, by concurrent requests"),
        ("ttft_median_s", "Time to first token (median), by concurrent requests"),
        ("latency_p90_s", "Request latency (p90), by concurrent requests"),
        ("decode_tokens_per_s", "Decode tokens/s per request (after the first token), by concurrent requests"),
        ("bandwidth_bound_share", "Share of the memory-bandwidth bound (decode tokens/s per request / (bandwidth / weight bytes)), by concurrent requests"),
        ("peak_gpu_mem_mb", "GPU memory, NVML peak during the level (busiest GPU), by concurrent requests"),
        ("power_w", "GPU power draw, NVML mean during the level (all GPUs), by concurrent requests"),
    ):
        kind = spec_for("cost", metric).kind
        rows = []
        for dep in view.deployments:
            vals = [view.score(dep, "cost", c, metric) for c in levels]
            if all(v is None for v in vals):
                continue
            rows.append([Cell(dep)] + [Cell(fmt(v["value"], kind)) if v is not None else Cell("–") for v in vals])
        if rows:
            out.append(Table(f"cost-{metric}", title, ["deployment"] + [c[1:] for c in levels], rows,
                             "Median over repeats; requests arrive together at each level."))
    rows = []
    for dep in view.deployments:
        start = view.score(dep, "cost", "all", "startup_s")
        peak = measured_peak(view, dep)
        if start is not None or peak:
            rows.append([Cell(dep), Cell(fmt(start["value"], spec_for("cost", "startup_s").kind) if start is not None else "–"),
                         Cell(fmt(peak[0] / 2**20, "mb") + f" ({peak[1]})" if peak else "–")])
    if rows:
        out.append(Table("cost-startup", "Start-up and peak memory", ["deployment", "model load", "peak memory"], rows))
    return out


def _gb(n: int | None, estimate: bool | None = False) -> str:
    """Bytes as GB (10^9); a size the ledger could not know stays "unknown", never 0."""
    return "unknown" if n is None else ("~" if estimate else "") + f"{n / 1e9:.2f} GB"


def ledger_table(view: RunView) -> Table:
    """The memory ledger's prediction beside the cost suite's measured peak (when both exist)."""
    ledger = view.run.manifest.get("ledger") or []
    rows = []
    gb = 1e9
    for r in ledger:
        peak = measured_peak(view, r["deployment"])
        predicted = r.get("per_device_bytes")
        ratio = f"{peak[0] / predicted:.2f}" if peak and predicted else "–"  # bytes / bytes
        rows.append([Cell(r["deployment"]), Cell(str(r.get("precision", "–"))), Cell(str(r.get("devices", "–"))),
                     Cell(_gb(r.get("weights_bytes"), r.get("estimate"))), Cell(_gb(r.get("kv_bytes"))),
                     Cell(_gb(predicted, r.get("estimate"))), Cell({True: "yes", False: "NO", None: "unknown"}[r.get("fits")]),
                     Cell(f"{peak[0] / gb:.2f} GB ({peak[1]})" if peak else "not measured"), Cell(ratio),
                     Cell(str(r.get("notes", "")))])
    return Table("ledger", "Memory ledger: predicted before loading vs measured", [
        "deployment", "precision", "devices", "weights", "KV cache", "predicted per device", "fits", "measured peak",
        "measured / predicted", "notes"], rows,
        "GB = 10⁹ bytes. An engine that reserves its share of a device up front has a measured peak that tracks the reservation.")


# -- human ratings -----------------------------------------------------------------------------


def human_tables(view: RunView) -> list[Table]:
    h = view.human
    if not h:
        return []
    out = []
    absolute = h.get("absolute", pd.DataFrame())
    if not absolute.empty:
        cats = [c for c in list(CATEGORIES) + ["all"] if c in set(absolute.category)]
        rows = [[Cell(d, "(reference)" if d == view.reference else "")] + [human_cell(view, d, c) for c in cats]
                for d in view.deployments if d in set(absolute.deployment)]
        out.append(Table("human-absolute", "Mean rating (1–5) by category", ["deployment"] + [CATEGORY_LABEL[c] for c in cats],
                         rows, "Intervals resample whole items (two raters on one output are not two observations).",
                         numeric=True))
    pw = h.get("pairwise", pd.DataFrame())
    if not pw.empty:
        rows = []
        pct = spec_for("ratings", "win_rate").kind
        for r in pw.itertuples():
            net = cell({"value": r.net, "ci_low": r.net_low, "ci_high": r.net_high}, None, spec_for("ratings", "net_preference"))
            rows.append([Cell(r.deployment), Cell(CATEGORY_LABEL.get(r.category, r.category)), plain(r.n_ratings),
                         Cell(fmt(r.win_rate, pct), fmt_interval(r.win_low, r.win_high, pct)),
                         Cell(fmt(r.tie_rate, pct), fmt_interval(r.tie_low, r.tie_high, pct)),
                         Cell(fmt(r.loss_rate, pct), fmt_interval(r.loss_low, r.loss_high, pct)),
                         Cell(signed(f"{r.net:+.2f}"), net.interval)])
        out.append(Table("human-pairwise", f"Side by side with the reference ({view.reference})",
                         ["deployment", "category", "ratings", "win", "tie", "loss", "net (win − loss)"], rows,
                         "Win/tie/loss: Wilson intervals per rating; net: item bootstrap."))
    ag = h.get("agreement", pd.DataFrame())
    if not ag.empty:
        rows = [[Cell(r.mode), Cell(CATEGORY_LABEL.get(r.category, r.category)),
                 Cell(fmt(r.alpha) if isnum(r.alpha) else "undefined"), plain(r.n_raters), plain(r.n_items),
                 plain(r.n_pairable_units)] for r in ag.itertuples()]
        out.append(Table("human-agreement", "Agreement between raters (Krippendorff's alpha, ordinal)",
                         ["mode", "category", "alpha", "raters", "items", "outputs rated twice+"], rows,
                         "1 = perfect agreement, 0 = chance; below ~0.67 conclusions from the ratings are tentative."))
    return out


# -- what ran where --------------------------------------------------------------------------


def hardware_table(view: RunView) -> Table:
    rows = []
    for name in view.deployments:
        dep = view.run.manifest["deployments"][name]
        hw = dep.get("hardware") or {}
        notes = "; ".join([hw.get("explanation") or ""] + list(hw.get("notes") or []))
        rows.append([Cell(name), Cell(dep.get("engine", "–")), Cell(str(dep.get("source", "–"))),
                     Cell(str(dep.get("variant") or "–")), Cell(str(hw.get("requested_quantization") or "none")),
                     Cell(str(hw.get("effective_precision", "–"))), Cell(str(hw.get("device", "–"))), Cell(notes.strip("; "))])
    return Table("hardware", "", ["deployment", "engine", "model", "variant", "requested",
                                                               "effective precision", "device", "explanation"], rows)


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
    for lang, sigs in bleu_signatures(view).items():
        for name, sig in sigs.items():
            rows.append([Cell(f"prompts · {name} en-{lang}"), Cell(str(sig))])
    for suite, info in view.suite_info.items():
        for k, v in _flatten(info):
            if k.startswith("bleu_signatures"):
                continue
            rows.append([Cell(f"{suite} · {k}"), Cell(v)])
    return Table("signatures", "Signatures and provenance", ["what", "value"], rows,
                 "Everything needed to reproduce a number: metric signatures, data files and their hashes, methods.")


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict):
        out = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
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
