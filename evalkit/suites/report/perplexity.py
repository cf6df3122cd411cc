"""The perplexity suite in the report: its tables (llama-perplexity's block too), plot and verdict columns.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from evalkit.report.cells import Cell, Table, better_note, cell, fmt, fmt_interval, isnum, spec_for
from evalkit.report.render import Section, some
from evalkit.report.tables import metric_table
from evalkit.report.verdict import Column
from evalkit.report.view import RunView
from evalkit.suites.perplexity import same_weights
from evalkit.report.plots import Plot, colors, drawn, figure, png

SUITE = "perplexity"


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
    ks: dict[str, str] = {}  # bounded deployment -> the top-k its bound used (a server may allow less than asked)
    for d in view.deployments:
        kind = kld_kind(view, d)
        if kind.startswith("exact"):
            exact.setdefault(kind, []).append(d)
        elif kind:
            ks[d] = _bound_k(view, d) or str(view.suite_info.get("perplexity", {}).get("top_k", "k"))
            bound.append(f"{d} ({kind.removeprefix('lower bound').lstrip(', ')})")
        b = view.score(d, "perplexity", "text", "kld_bound_bias")
        if b is not None and isnum(b["value"]):
            bias.append((d, float(b["value"])))
    parts = ["KLD is KL(reference ‖ deployment) per token."]
    for kind, deps in exact.items():
        parts.append(f"Exact over the full vocabulary for {', '.join(deps)} ({kind}: its distributions stored once, "
                     "each deployment compared token by token).")
    if bound:
        k = next(iter(ks.values())) if len(set(ks.values())) == 1 else "k (" + ", ".join(f"{d}: {v}" for d, v in ks.items()) + ")"
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

def _bound_k(view: RunView, dep: str) -> str | None:
    """The top-k a deployment's KLD bound used, as its comparison row states it ("top-20+tail ...")."""
    if view.comps.empty:
        return None
    comp = view.comps[(view.comps.deployment == dep) & (view.comps.suite == "perplexity") & (view.comps.metric == "kld")]
    found = re.search(r"top-(\d+)\+tail", str(comp.iloc[0]["method"])) if not comp.empty and "method" in comp else None
    return found.group(1) if found else None


def kld_kind(view: RunView, dep: str) -> str:
    """How a deployment's KLD was measured, in words: exact against whom, or a lower bound and how far it reads
    below the exact value another engine measured on the same weights in this run. "" without KLD."""
    flag = view.score(dep, "perplexity", "text", "kld_exact")
    if flag is None:
        return ""
    comp = view.comps[(view.comps.deployment == dep) & (view.comps.suite == "perplexity") & (view.comps.metric == "kld")] \
        if not view.comps.empty else view.comps
    against = f" against {comp.iloc[0]['reference']}" if not comp.empty else ""
    if float(flag["value"]) == 1.0:
        return f"exact{against}"
    text = f"lower bound{against}"
    below = view.score(dep, "perplexity", "text", "kld_bound_reads_below")
    if below is not None and isnum(below["value"]):
        x = float(below["value"])
        exact = view.score(dep, "perplexity", "text", "kld_same_weights_exact")
        by = [d for d in view.deployments if d != dep and same_weights(view.run.manifest, d, dep)
              and (f := view.score(d, "perplexity", "text", "kld_exact")) is not None and float(f["value"]) == 1.0]
        text += (f", reads {abs(100 * x):.1f}% {'below' if x >= 0 else 'above'} the exact value measured on the same "
                 f"weights ({fmt(exact['value'] if exact is not None else None, 'kld')}{', ' + by[0] if by else ''})")
        own = view.score(by[0], "perplexity", "text", "kld_bound_bias") if by else None
        if x < 0:  # above: the two engines' numerics differ by more than the top-k truncation loses
            text += ": the engines' numerics differ by more than the top-k truncation loses" + (
                f" ({100 * float(own['value']):.1f}% on {by[0]}'s exact pair)" if own is not None and isnum(own["value"]) else "")
    return text

def _kld_cell(view: RunView, dep: str) -> Cell:
    if dep == view.reference:
        return Cell("–", note="reference")
    score = view.score(dep, "perplexity", "text", "kld_mean")
    comp = view.comp(dep, "perplexity", "text", "kld")
    if comp is not None and not isnum(comp.get("value")):  # not computed (e.g. tokenizations differ)
        return Cell("–", note=str(comp.get("method")))
    c = cell(score, comp, spec_for("perplexity", "kld"))
    kind = kld_kind(view, dep)
    # The value is the difference (the reference's KLD is 0): shown once, with its interval beside the mark.
    return Cell(c.value, "", "", c.interval, c.mark, "; ".join(x for x in (kind, c.note) if x), c.raw)

# The KLD distribution as its quantile function (llama.cpp's percentile rows, min to max).
KLD_POINTS = (("min", "kld_min"), ("0.1%", "kld_p0_1"), ("1%", "kld_p1"), ("5%", "kld_p5"), ("10%", "kld_p10"),
              ("median", "kld_median"), ("90%", "kld_p90"), ("95%", "kld_p95"), ("99%", "kld_p99"),
              ("99.9%", "kld_p99_9"), ("max", "kld_max"))

def perplexity_plot(view: RunView) -> Plot | None:
    items = view.items("perplexity")
    drift = {d: [view.score(d, "perplexity", "text", m) for _, m in KLD_POINTS] for d in view.deployments if d != view.reference}
    drift = {d: v for d, v in drift.items() if any(x is not None for x in v)}
    if items.empty and not drift:
        return None
    col = colors(view)
    spec: dict[str, Any] = {"drift": [], "boxes": [], "kld_label": "KL(reference ‖ deployment), nats" + better_note("perplexity", "kld"),
                            "ppl_label": "perplexity of each chunk" + better_note("perplexity", "ppl")}
    for d, rows in drift.items():
        flag = view.score(d, "perplexity", "text", "kld_exact")
        exact = flag is not None and float(flag["value"]) == 1.0
        spec["drift"].append({"color": col[d], "exact": exact, "label": d if exact else f"{d} (lower bound)",
                              "values": [float(r["value"]) if r is not None and float(r["value"]) > 0 else math.nan for r in rows]})
    if not items.empty and "ppl" in items:
        spec["boxes"] = [{"deployment": d, "color": col[d], "ppl": items[items.deployment == d].ppl.to_numpy(float).tolist()}
                         for d in view.deployments if d in set(items.deployment)]
    return Plot("perplexity", "Perplexity: KLD distribution and PPL per chunk", drawn("perplexity", spec, _draw_perplexity),
                "Per-token KLD distribution per deployment (percentiles, log scale; dashed: top-k lower bound), "
                "and box plots of per-chunk perplexity")

def _draw_perplexity(spec: dict[str, Any]) -> bytes:
    n = int(bool(spec["drift"])) + int(bool(spec["boxes"]))
    fig, axes = figure(4.4 * n + 0.4, 3.2, ncols=n)
    i = 0
    if spec["drift"]:
        ax = axes[i]
        for line in spec["drift"]:
            ax.plot(range(len(KLD_POINTS)), line["values"], "o-" if line["exact"] else "o--", color=line["color"],
                    label=line["label"])
        ax.set_yscale("log")
        ax.set_xticks(range(len(KLD_POINTS)), [p for p, _ in KLD_POINTS], fontsize=7, rotation=45)
        ax.set_ylabel(spec["kld_label"])
        ax.set_title("Distribution of per-token KLD (percentiles)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="best")
        i += 1
    if spec["boxes"]:
        ax = axes[i]
        boxes = spec["boxes"]
        data = [np.asarray(b["ppl"], dtype=float) for b in boxes]
        bp = ax.boxplot(data, widths=0.5, patch_artist=True, showfliers=False)
        for patch, b in zip(bp["boxes"], boxes):
            patch.set_facecolor(b["color"])
            patch.set_alpha(0.35)
        rng = np.random.default_rng(0)  # jitter only: where the points sit sideways means nothing
        for k, (b, v) in enumerate(zip(boxes, data), start=1):
            ax.plot(k + rng.uniform(-0.12, 0.12, len(v)), v, "o", color=b["color"], ms=3.5)
        ax.set_xticks(range(1, len(boxes) + 1), [b["deployment"] for b in boxes], fontsize=8)
        ax.set_ylabel(spec["ppl_label"])
        ax.set_title("PPL by text chunk", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    return png(fig)


# -- drift by position ----------------------------------------------------------------------------------------------

POS = "pos "  # the position buckets' score-row category prefix (suites.perplexity.scoring.POSITION_PREFIX)


def position_buckets(view: RunView, dep: str, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(bucket label, {metric: score row}) for each position bucket of `dep`, in position order. `prefix` "kv_":
    the kv_reference rows (against the same weights with a 16-bit KV cache), keyed by the unprefixed names."""
    s = view.scores
    if s.empty:
        return []
    rows = s[(s.deployment == dep) & (s.suite == SUITE) & s.category.astype(str).str.startswith(POS)]
    out: dict[str, dict[str, Any]] = {}
    for _, r in rows.iterrows():
        metric = str(r["metric"])
        if metric.startswith(prefix) and metric[len(prefix):] in ("pos_kld", "pos_top1_agreement", "pos_nll_diff"):
            out.setdefault(str(r["category"])[len(POS):], {})[metric[len(prefix):]] = r
    return sorted(out.items(), key=lambda kv: _bucket_start(kv[0]))


def _bucket_start(label: str) -> int:
    lo = label.split("-")[0]
    return int(lo[:-1]) * 1024 if lo.endswith("K") else int(lo)


def _headline(view: RunView, dep: str, prefix: str = "") -> Cell:
    """The first bucket where top-1 agreement falls below the threshold, with that bucket's agreement and interval."""
    s = view.scores
    rows = s[(s.deployment == dep) & (s.suite == SUITE) & (s.metric == prefix + "top1_below_from")] if not s.empty else s
    if rows.empty:
        return Cell("–")
    r = rows.iloc[0]
    if not isnum(r["value"]):
        return Cell("none")
    label = str(r["category"])[len(POS):]
    top = view.score(dep, SUITE, str(r["category"]), prefix + "pos_top1_agreement")
    if top is None:
        return Cell(label)
    return Cell(label, "", "", f"top-1 {fmt(top['value'], 'pct')} {fmt_interval(top['ci_low'], top['ci_high'], 'pct')}".strip())


def position_table(view: RunView, prefix: str = "") -> Table:
    """Drift by position against the reference; `prefix` "kv_": against each quantized-KV deployment's twin."""
    deps = [d for d in view.deployments if position_buckets(view, d, prefix)]
    labels: list[str] = []
    for d in deps:
        labels += [b for b, _ in position_buckets(view, d, prefix) if b not in labels]
    labels.sort(key=_bucket_start)
    rows = []
    for d in deps:
        got = dict(position_buckets(view, d, prefix))
        cells = [Cell(d)]
        for b in labels:
            m = got.get(b, {})
            kld, top = m.get("pos_kld"), m.get("pos_top1_agreement")
            if kld is None or top is None:
                cells.append(Cell("–"))
                continue
            cells.append(Cell(f"{fmt(kld['value'], 'kld')} / {fmt(top['value'], 'pct')}",
                              fmt_interval(top["ci_low"], top["ci_high"], "pct"), note=f"{int(kld['n'])} tokens"))
        rows.append(cells + [_headline(view, d, prefix)])
    threshold = view.suite_info.get(SUITE, {}).get("top1_threshold", 0.95)
    if prefix:
        return Table("perplexity-kv-positions", "The KV cache's own drift by position (same weights, 16-bit KV cache)",
                     ["deployment"] + [f"{b} tokens" for b in labels] + [f"first bucket below {100 * float(threshold):.0f}% top-1"],
                     rows, "suites.perplexity.kv_reference: each deployment with a quantized KV cache against the run's "
                     "deployment of the same weight files on the same engine with a 16-bit KV cache (its KV precision "
                     "alone): KLD (nats/token, top-k + tail lower bound) / top-1 agreement by position bucket; "
                     "intervals as above.", numeric=True)
    return Table("perplexity-positions", "Drift by position in the context", ["deployment"] + [f"{b} tokens" for b in labels]
                 + [f"first bucket below {100 * float(threshold):.0f}% top-1"], rows,
                 "KLD (nats/token) / top-1 agreement with the reference over the scored tokens whose position in their "
                 "chunk falls in each bucket; intervals: top-1 agreement, block-clustered (runs of 64 tokens). The last "
                 "column is the first bucket whose top-1 agreement is below the threshold, with that bucket's agreement.",
                 numeric=True)


def position_plot(view: RunView) -> Plot | None:
    col = colors(view)
    lines = []
    for d in view.deployments:
        buckets = position_buckets(view, d)
        if not buckets:
            continue
        lines.append({"label": d, "color": col[d], "buckets": [b for b, _ in buckets],
                      "kld": [float(m["pos_kld"]["value"]) if "pos_kld" in m else math.nan for _, m in buckets],
                      "top1": [float(m["pos_top1_agreement"]["value"]) if "pos_top1_agreement" in m else math.nan for _, m in buckets],
                      "top1_lo": [float(m["pos_top1_agreement"]["ci_low"]) if "pos_top1_agreement" in m and isnum(m["pos_top1_agreement"]["ci_low"]) else math.nan for _, m in buckets],
                      "top1_hi": [float(m["pos_top1_agreement"]["ci_high"]) if "pos_top1_agreement" in m and isnum(m["pos_top1_agreement"]["ci_high"]) else math.nan for _, m in buckets]})
    if not lines:
        return None
    threshold = float(view.suite_info.get(SUITE, {}).get("top1_threshold", 0.95))
    spec = {"lines": lines, "threshold": threshold}
    return Plot("perplexity-positions", "Drift by position in the context", drawn("perplexity-positions", spec, _draw_positions),
                "KLD and top-1 agreement with the reference per position bucket, for every deployment")


def _draw_positions(spec: dict[str, Any]) -> bytes:
    fig, axes = figure(9.2, 3.2, ncols=2)
    labels: list[str] = []
    for line in spec["lines"]:
        labels += [b for b in line["buckets"] if b not in labels]
    labels.sort(key=_bucket_start)
    x = {b: i for i, b in enumerate(labels)}
    for line in spec["lines"]:
        xs = [x[b] for b in line["buckets"]]
        axes[0].plot(xs, [v if v > 0 else math.nan for v in line["kld"]], "o-", color=line["color"], label=line["label"])
        axes[1].plot(xs, line["top1"], "o-", color=line["color"], label=line["label"])
        axes[1].fill_between(xs, line["top1_lo"], line["top1_hi"], color=line["color"], alpha=0.15)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("KL(reference ‖ deployment), nats")
    axes[0].set_title("KLD by position", fontsize=10)
    axes[1].axhline(spec["threshold"], color="grey", ls="--", lw=1)
    axes[1].set_ylabel("top-1 agreement")
    axes[1].set_title("Top-1 agreement by position", fontsize=10)
    for ax in axes:
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_xlabel("position in the context (tokens)")
        ax.grid(alpha=0.3, which="both")
    axes[1].legend(fontsize=8, loc="best")
    return png(fig)


def section(view: RunView) -> Section:
    tables = [perplexity_table(view), llama_block_table(view)]
    positions = position_table(view)
    if not positions.empty:
        tables.append(positions)
    kv_positions = position_table(view, "kv_")
    if not kv_positions.empty:
        tables.append(kv_positions)
    return Section(SUITE, "Perplexity and distribution drift", "", tables, some(perplexity_plot(view), position_plot(view)))


def verdict_columns(view: RunView) -> list[Column]:
    if not view.has(SUITE):
        return []
    return [Column("perplexity", "PPL", lambda d: view.cell(d, SUITE, "text", "ppl"), "PPL"),
            Column("perplexity", "KLD", lambda d: _kld_cell(view, d), "KLD")]
