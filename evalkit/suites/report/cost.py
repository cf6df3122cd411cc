"""The cost suite in the report: speed and memory by concurrency, its plot, and the memory it measured.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

from typing import Any

from evalkit.report.cells import Cell, Table, better_note, fmt, spec_for
from evalkit.report.render import Section, some
from evalkit.report.view import RunView
from evalkit.report.plots import Plot, drawn, figure, legend, png, style

SUITE = "cost"


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

    spec = {"style": style(view), "levels": levels, "panels": [
        {"ylabel": ylabel + better_note("cost", metric), "points": {d: points(d, metric, scale) for d in view.deployments}}
        for metric, ylabel, scale in panels]}
    return Plot("cost", "Throughput and time to first token by concurrency", drawn("cost", spec, _draw_cost),
                "Line plots of per-request and total throughput and of time to first token against concurrency")

def _draw_cost(spec: dict[str, Any]) -> bytes:
    style, levels = spec["style"], spec["levels"]
    fig, axes = figure(11.0, 3.1, ncols=3)
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
    legend(fig, axes[0])
    return png(fig)

def measured_peak(view: RunView, dep: str) -> tuple[int, str] | None:
    """Highest memory the cost suite saw, in bytes: the busiest GPU when GPUs were sampled, else the worker's
    process tree (vLLM's engine-core process included): its high-water mark where recorded, else the peak
    sampled during the levels. The records hold MiB (2^20 bytes)."""
    s = view.suite_scores("cost")
    if s.empty:
        return None
    mine = s[s.deployment == dep]
    for metric, where in (("peak_gpu_mem_mb", "busiest GPU"), ("worker_peak_rss_mb", "RAM, worker high-water"),
                          ("peak_rss_mb", "RAM, process tree")):
        v = mine[mine.metric == metric].value
        if not v.empty:
            return int(float(v.max()) * 2**20), where
    return None


def section(view: RunView) -> Section:
    return Section(SUITE, "Cost: speed and memory", "", cost_tables(view), some(cost_plot(view)))
