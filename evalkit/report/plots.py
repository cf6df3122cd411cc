"""The report's figures as PNG bytes (matplotlib, Agg canvas; no pyplot global state, no display needed).

Every figure is drawn from the same frames the tables use (RunView): nothing is recomputed. Each function
returns None or [] when its data are absent, so a run with one suite renders only that suite's plots.

Figures drawn from a plain spec (`_drawn`: the numbers, labels and colours a figure shows) are kept by the
spec's hash in the result cache: a re-run whose figures show the same numbers imports no matplotlib and draws
nothing (drawing took about a second of a fully cached re-run).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

import numpy as np
import pandas as pd

from evalkit.memo import Memo
from evalkit.report.cells import CATEGORIES, CATEGORY_LABEL, better_note, isnum
from evalkit.report.view import RunView, measured_peak

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 110
REFERENCE_COLOR = "#444444"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass(frozen=True)
class Plot:
    key: str  # also the file name (report_files/<key>.png) next to report.md
    title: str
    png: bytes
    alt: str

    @property
    def b64(self) -> str:
        return base64.b64encode(self.png).decode("ascii")


# -- kept figures --------------------------------------------------------------------------------

FIGURE_FORMAT = 1  # the kept figures' key layout: a change draws them again
_FIGURES = Memo(".png")


def figure_memo(where: Path | None) -> ContextManager[None]:
    """Keep figures drawn from a spec under `where` (None: draw every one) inside the block."""
    return _FIGURES.kept_under(where)


@lru_cache(maxsize=1)
def _drawing_code() -> str:
    """What else a kept figure depends on: the drawing code (this module and the decision section's) and
    matplotlib's version."""
    from importlib.metadata import version  # not matplotlib.__version__: that imports matplotlib

    code = hashlib.sha256()
    for module in ("plots.py", "decision_section.py"):
        code.update((Path(__file__).parent / module).read_bytes())
    return code.hexdigest() + " matplotlib " + version("matplotlib")


def _drawn(kind: str, spec: dict[str, Any], draw: Callable[[dict[str, Any]], bytes]) -> bytes:
    """draw(spec), or the PNG kept for the same (kind, spec) by the same drawing code."""
    return _FIGURES.answer(lambda: json.dumps([FIGURE_FORMAT, kind, spec, _drawing_code()], sort_keys=True),
                           lambda: draw(spec))


def _style(view: RunView) -> dict[str, Any]:
    """The deployments in order with their colours and legend labels: the part of a spec every figure shares."""
    return {"deployments": list(view.deployments), "colors": colors(view),
            "labels": {d: _label(view, d) for d in view.deployments}}


# -- drawing -------------------------------------------------------------------------------------


def _figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # no version stamp: stable bytes
    return buf.getvalue()


def _legend(fig: Figure, ax: Axes) -> None:
    """One legend below the panels, so it never covers data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8, frameon=False)


def colors(view: RunView) -> dict[str, str]:
    others = [d for d in view.deployments if d != view.reference]
    out = {view.reference: REFERENCE_COLOR}
    out.update({d: PALETTE[i % len(PALETTE)] for i, d in enumerate(others)})
    return out


def _label(view: RunView, dep: str) -> str:
    return f"{dep} (reference)" if dep == view.reference else dep


def _dots(ax: Axes, style: dict[str, Any], groups: Sequence[str], values: dict[str, Sequence[Sequence[float]]],
          scale: float = 1.0, horizontal: bool = False) -> None:
    """One point per deployment and group with its 95% interval, deployments side by side within a group."""
    deps = [d for d in style["deployments"] if d in values]
    width = 0.7 / max(1, len(deps))
    col = style["colors"]
    for k, dep in enumerate(deps):
        pos = np.arange(len(groups)) + (k - (len(deps) - 1) / 2) * width
        v = np.array([x[0] for x in values[dep]], dtype=float) * scale
        lo = np.array([x[1] for x in values[dep]], dtype=float) * scale
        hi = np.array([x[2] for x in values[dep]], dtype=float) * scale
        err = np.vstack([np.where(np.isfinite(lo), v - lo, 0), np.where(np.isfinite(hi), hi - v, 0)])
        kw: dict[str, Any] = dict(fmt="o", color=col[dep], ecolor=col[dep], elinewidth=1.6, capsize=3, ms=5,
                                  label=style["labels"][dep])
        if horizontal:
            ax.errorbar(v, pos, xerr=err, **kw)
        else:
            ax.errorbar(pos, v, yerr=err, **kw)
    ticks = np.arange(len(groups))
    if horizontal:
        ax.set_yticks(ticks, groups)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xticks(ticks, groups)
        ax.grid(axis="y", alpha=0.3)


def _triple(row: Any) -> tuple[float, float, float]:
    if row is None:
        return (math.nan, math.nan, math.nan)
    g = row.get
    return (float(g("value")) if isnum(g("value")) else math.nan,
            float(g("ci_low")) if isnum(g("ci_low")) else math.nan,
            float(g("ci_high")) if isnum(g("ci_high")) else math.nan)


# -- prompts -----------------------------------------------------------------------------------


def prompts_plot(view: RunView) -> Plot | None:
    shares = [(lab, cat, m) for lab, cat, m in (("code\npass@1", "code", "pass@1"), ("reasoning\ncorrect", "reasoning", "contains"),
                                                 ("QA\ncorrect", "qa", "contains"))
              if any(view.score(d, "prompts", cat, m) is not None for d in view.deployments)]
    s = view.suite_scores("prompts")
    mt = sorted({str(m) for m in s.metric if str(m).startswith(("chrf_en-", "bleu_en-"))}) if not s.empty else []
    if not shares and not mt:
        return None
    panels = [p for p in ((shares, "share of items (%)" + (better_note("prompts", shares[0][2]) if shares else ""), 100.0),
                          ([(m.replace("_", " ").replace("chrf", "chrF").replace("bleu", "BLEU"), "translation", m)
                            for m in mt], "score (0–100)" + (better_note("prompts", mt[0]) if mt else ""), 1.0)) if p[0]]
    spec = {"style": _style(view), "panels": [
        {"groups": [c[0] for c in cols], "ylabel": ylabel, "scale": scale,
         "values": {d: [_triple(view.score(d, "prompts", cat, m)) for _, cat, m in cols] for d in view.deployments}}
        for cols, ylabel, scale in panels]}
    return Plot("prompts-categories", "Prompt suite: score by category (95% intervals)",
                _drawn("prompts-categories", spec, _draw_prompts),
                "Dot plot of each deployment's score per prompt category with interval bars")


def _draw_prompts(spec: dict[str, Any]) -> bytes:
    panels = spec["panels"]
    fig, axes = _figure(4.2 * len(panels) + 0.6, 3.2, ncols=len(panels))
    for ax, panel in zip(axes, panels):
        _dots(ax, spec["style"], panel["groups"], panel["values"], panel["scale"])
        ax.set_ylabel(panel["ylabel"])
        ax.set_ylim(-3, 103)
    _legend(fig, axes[0])
    fig.suptitle("Prompt suite: score by category with 95% intervals", fontsize=11)
    return _png(fig)


# -- human ratings -----------------------------------------------------------------------------


def human_plot(view: RunView) -> Plot | None:
    absolute = view.human.get("absolute", pd.DataFrame())
    pairwise = view.human.get("pairwise", pd.DataFrame())
    if absolute.empty and pairwise.empty:
        return None
    n = int(not absolute.empty) + int(not pairwise.empty)
    fig, axes = _figure(4.6 * n + 0.4, 3.2, ncols=n)
    i = 0
    if not absolute.empty:
        cats = [c for c in list(CATEGORIES) + ["all"] if c in set(absolute.category)]
        vals = {}
        for d in view.deployments:
            a = absolute[absolute.deployment == d].set_index("category")
            if a.empty:
                continue
            vals[d] = [(a.at[c, "mean"], a.at[c, "ci_low"], a.at[c, "ci_high"]) if c in a.index else (math.nan,) * 3
                       for c in cats]
        _dots(axes[i], _style(view), [CATEGORY_LABEL[c] for c in cats], vals)
        axes[i].set_ylim(0.8, 5.2)
        axes[i].set_ylabel("mean rating (1–5)")
        axes[i].set_title("Mean human rating", fontsize=10)
        _legend(fig, axes[i])
        i += 1
    if not pairwise.empty:
        ax = axes[i]
        p = pairwise[pairwise.category == "all"]
        y = np.arange(len(p))
        left = np.zeros(len(p))
        for col, color, label in (("win_rate", "#2ca02c", "win"), ("tie_rate", "#bbbbbb", "tie"), ("loss_rate", "#d62728", "loss")):
            v = p[col].to_numpy(float) * 100
            ax.barh(y, v, left=left, color=color, label=label)
            for yy, l, vv in zip(y, left, v):
                if vv >= 8:
                    ax.text(l + vv / 2, yy, f"{vv:.0f}%", ha="center", va="center", fontsize=8, color="white" if label != "tie" else "black")
            left += v
        ax.set_yticks(y, list(p.deployment))
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"% of side-by-side ratings vs {view.reference}")
        ax.set_title("Win / tie / loss against the reference", fontsize=10)
        ax.set_ylim(len(p) - 0.5 + 0.7, -0.5)  # headroom below the last bar for the legend
        ax.legend(fontsize=8, ncols=3, loc="lower center", frameon=False)
    return Plot("human-ratings", "Human ratings: means with 95% intervals; win/tie/loss", _png(fig),
                "Mean human ratings per category with intervals, and stacked win/tie/loss bars per deployment")


# -- perplexity --------------------------------------------------------------------------------

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
    return Plot("perplexity", "Perplexity: KLD distribution and PPL per chunk", _drawn("perplexity", spec, _draw_perplexity),
                "Per-token KLD distribution per deployment (percentiles, log scale; dashed: top-k lower bound), "
                "and box plots of per-chunk perplexity")


def _draw_perplexity(spec: dict[str, Any]) -> bytes:
    n = int(bool(spec["drift"])) + int(bool(spec["boxes"]))
    fig, axes = _figure(4.4 * n + 0.4, 3.2, ncols=n)
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
    return _png(fig)


# -- MMLU --------------------------------------------------------------------------------------


def mmlu_plot(view: RunView) -> Plot | None:
    s = view.suite_scores("mmlu")
    if s.empty:
        return None
    subjects = sorted({str(c) for c in s[s.metric == "accuracy"].category if str(c) != "all"}) + ["all"]
    spec = {"style": _style(view), "subjects": [x.replace("_", " ") for x in subjects],
            "values": {d: [_triple(view.score(d, "mmlu", sub, "accuracy")) for sub in subjects] for d in view.deployments},
            "xlabel": "accuracy (%) with Wilson interval" + better_note("mmlu", "accuracy")}
    return Plot("mmlu-subjects", f"{view.mmlu_label} accuracy by subject (95% intervals)",
                _drawn("mmlu-subjects", spec, _draw_mmlu), "Accuracy per subject and deployment with interval bars")


def _draw_mmlu(spec: dict[str, Any]) -> bytes:
    subjects = spec["subjects"]
    fig, axes = _figure(7.5, 0.32 * len(subjects) * max(1, len(spec["style"]["deployments"])) / 2 + 1.4)
    ax = axes[0]
    _dots(ax, spec["style"], subjects, spec["values"], 100.0, horizontal=True)
    ax.set_xlim(-2, 102)
    ax.set_xlabel(spec["xlabel"])
    ax.axhline(len(subjects) - 1.5, color="#999999", lw=0.8)
    _legend(fig, ax)
    return _png(fig)


# -- long context ------------------------------------------------------------------------------


def _length_axis(ax: Axes, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")
    ax.grid(alpha=0.3)


def longcontext_plots(view: RunView) -> list[Plot]:
    s = view.suite_scores("longcontext")
    if s.empty:
        return []
    lengths = sorted({int(str(c)[1:]) for c in s.category if str(c).startswith("L")})
    lines = {}
    for d in view.deployments:
        rep = [view.score(d, "longcontext", f"L{n}", "seq_rep_4") for n in lengths]
        rec = [view.score(d, "longcontext", f"L{n}", "recall_accuracy") for n in lengths]
        lines[d] = {"rep": [[n, 100 * float(r["value"])] for n, r in zip(lengths, rep) if r is not None],
                    "recall": [[n, *_triple(r)] for n, r in zip(lengths, rec) if r is not None]}
    spec = {"style": _style(view), "lengths": lengths, "lines": lines,
            "rep_label": "seq-rep-4 (% repeated 4-grams)" + better_note("longcontext", "seq_rep_4"),
            "recall_label": "recall (%) with Wilson interval" + better_note("longcontext", "recall_accuracy")}
    out = [Plot("longcontext-lengths", "Repetition and recall by context length",
                _drawn("longcontext-lengths", spec, _draw_longcontext),
                "Line plots of repetition and pass-key recall against context length per deployment")]
    heat = recall_heatmap(view)
    return out + ([heat] if heat else [])


def _draw_longcontext(spec: dict[str, Any]) -> bytes:
    style, lengths = spec["style"], spec["lengths"]
    deps = style["deployments"]
    fig, (ax1, ax2) = _figure(9.0, 3.2, ncols=2)
    for k, d in enumerate(deps):
        dodge = 2 ** ((k - (len(deps) - 1) / 2) * 0.06)  # side by side on the log axis: equal values stay visible
        col, label = style["colors"][d], style["labels"][d]
        rep, rec = spec["lines"][d]["rep"], spec["lines"][d]["recall"]
        if rep:
            ax1.plot([n * dodge for n, _ in rep], [y for _, y in rep], "o-", color=col, label=label)
        if rec:
            v = np.array([r[1:] for r in rec]) * 100
            ax2.errorbar([r[0] * dodge for r in rec], v[:, 0], yerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]], fmt="o-",
                         color=col, capsize=3, label=label)
    for ax, title, ylabel in ((ax1, "Repetition of the continuation", spec["rep_label"]),
                              (ax2, "Pass-key recall", spec["recall_label"])):
        _length_axis(ax, lengths)
        ax.set_ylim(-4, 104)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
    _legend(fig, ax1)
    return _png(fig)


def recall_heatmap(view: RunView) -> Plot | None:
    items = view.items("longcontext")
    if items.empty or "kind" not in items:
        return None
    rec = items[items.kind == "recall"]
    if rec.empty:
        return None
    lengths = sorted(int(x) for x in rec.length_target.astype(int).unique())
    depths = sorted(float(x) for x in rec.depth.astype(float).unique())
    deps = [d for d in view.deployments if d in set(rec.deployment)]
    grids = {}
    for d in deps:
        grid: list[list[float]] = [[math.nan] * len(lengths) for _ in depths]
        for r in rec[rec.deployment == d].itertuples():
            if isinstance(r.skipped, str) and r.skipped:
                continue
            ok = str(r.correct).lower() in ("true", "1", "1.0")
            grid[depths.index(float(r.depth))][lengths.index(int(r.length_target))] = 1.0 if ok else 0.0
        grids[d] = grid
    spec = {"lengths": lengths, "depths": depths, "deployments": deps, "grids": grids}
    return Plot("longcontext-recall-heatmap", "Pass-key recall by length × depth (✓ found, ✗ missed, – not run)",
                _drawn("longcontext-recall-heatmap", spec, _draw_recall_heatmap),
                "Grid per deployment of recall success by context length and needle depth")


def _draw_recall_heatmap(spec: dict[str, Any]) -> bytes:
    from matplotlib.colors import ListedColormap

    lengths, depths, deps = spec["lengths"], spec["depths"], spec["deployments"]
    fig, axes = _figure(2.3 * len(deps) + 0.8, 0.45 * len(depths) + 1.5, ncols=len(deps))
    cmap = ListedColormap(["#e06666", "#6aa84f"]).with_extremes(bad="#dddddd")
    for ax, d in zip(axes, deps):
        grid = np.array(spec["grids"][d], dtype=float)
        ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "–" if np.isnan(v) else ("✓" if v else "✗"), ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{x:.0%}" for x in depths], fontsize=8)
        ax.set_title(d, fontsize=9)
        ax.set_xlabel("length")
    axes[0].set_ylabel("needle depth")
    return _png(fig)


# -- cost and memory -----------------------------------------------------------------------------


def cost_plot(view: RunView) -> Plot | None:
    s = view.suite_scores("cost")
    if s.empty:
        return None
    levels = sorted({int(str(c)[1:]) for c in s.category if str(c).startswith("c")})
    if not levels:
        return None
    panels = (("per_request_tokens_per_s", "tokens/s per request", 1.0), ("tokens_per_s", "tokens/s, all requests", 1.0),
              ("ttft_median_s", "time to first token (ms)", 1000.0))

    def points(d: str, metric: str, scale: float) -> list[tuple[int, float]]:
        rows = [(c, view.score(d, "cost", f"c{c}", metric)) for c in levels]
        return [(c, float(r["value"]) * scale) for c, r in rows if r is not None]

    spec = {"style": _style(view), "levels": levels, "panels": [
        {"ylabel": ylabel + better_note("cost", metric), "points": {d: points(d, metric, scale) for d in view.deployments}}
        for metric, ylabel, scale in panels]}
    return Plot("cost", "Throughput and time to first token by concurrency", _drawn("cost", spec, _draw_cost),
                "Line plots of per-request and total throughput and of time to first token against concurrency")


def _draw_cost(spec: dict[str, Any]) -> bytes:
    style, levels = spec["style"], spec["levels"]
    fig, axes = _figure(11.0, 3.1, ncols=3)
    for ax, panel in zip(axes, spec["panels"]):
        for d in style["deployments"]:
            pts = panel["points"][d]
            if pts:
                ax.plot(*zip(*pts), "o-", color=style["colors"][d], label=style["labels"][d])
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(panel["ylabel"])
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    _legend(fig, axes[0])
    return _png(fig)


def ledger_plot(view: RunView) -> Plot | None:
    ledger = view.run.manifest.get("ledger") or []
    rows = [(r["deployment"], (r.get("per_device_bytes") or 0) / 1e9, measured_peak(view, r["deployment"]))
            for r in ledger]
    if not rows:
        return None
    spec = {"deployments": [r[0] for r in rows], "predicted": [float(r[1]) for r in rows],
            "measured": [float(r[2][0]) / 1e9 if r[2] else 0 for r in rows],
            "budget": max((r.get("device_budget_bytes") or 0) for r in ledger) / 1e9}
    return Plot("ledger", "Memory: predicted vs measured", _drawn("ledger", spec, _draw_ledger),
                "Bars of predicted and measured memory per deployment")


def _draw_ledger(spec: dict[str, Any]) -> bytes:
    fig, axes = _figure(6.0, 0.45 * len(spec["deployments"]) + 1.5)
    ax = axes[0]
    y = np.arange(len(spec["deployments"]))
    ax.barh(y - 0.18, spec["predicted"], height=0.34, color="#9fc5e8", label="predicted per device")
    ax.barh(y + 0.18, spec["measured"], height=0.34, color="#3d85c6", label="measured peak")
    budget = spec["budget"]
    if budget:
        ax.axvline(budget, color="#cc0000", ls="--", lw=1, label=f"device budget {budget:.0f} GB")
    ax.set_yticks(y, spec["deployments"])
    ax.invert_yaxis()
    ax.set_xlabel("GB (10⁹ bytes)")
    ax.grid(axis="x", alpha=0.3)
    _legend(fig, ax)
    return _png(fig)
