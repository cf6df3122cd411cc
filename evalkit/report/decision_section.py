"""The report's opening section: the recommendation in one sentence, its table, and a Pareto plot.

Reads decision.json (written by scoring, evalkit/decision.py); nothing is decided here.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from evalkit.decision import Decision, DeploymentDecision, MarginResult, ScenarioDecision
from evalkit.report import plots as P
from evalkit.report.cells import Cell, Table, signed

VERDICT_LABEL = {"non-inferior": "non-inferior ✓", "inferior": "inferior ✗", "inconclusive": "inconclusive ?",
                 "reference": "reference"}


def _g(x: float | None, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return signed(f"{x:,.0f}" if abs(x) >= 10 ** (digits - 1) else f"{x:.{digits}g}")


def _margin_cell(m: MarginResult) -> Cell:
    if m.decision == "reference":
        return Cell("reference")
    if m.estimate is None:
        return Cell(VERDICT_LABEL[m.decision], note=m.note)
    what = "Δ " if m.basis == "difference" else ""
    interval = f"{what}{_g(m.estimate)} [{_g(m.ci_low)}, {_g(m.ci_high)}] vs {_g(m.margin)}"
    more = f"; ~{m.n_needed:,} items would settle it (now {m.n:,})" if m.n_needed else ""
    return Cell(VERDICT_LABEL[m.decision], interval + more, note=f"n = {m.n}; {m.basis}; {m.note}".rstrip("; "))


def _memory_cell(d: DeploymentDecision) -> Cell:
    if d.memory is None or d.memory.fits is None:
        return Cell("unknown", d.memory.note if d.memory else "")
    if d.memory.fits is False and d.memory.binding == "sequences":  # memory is not what binds: say what does
        return Cell("too few sequences", f"holds {d.memory.max_concurrency} at once", note=d.memory.note)
    if d.memory.fits is False and d.memory.binding == "context":
        return Cell("context too short", f"holds {d.memory.max_context:,} tokens", note=d.memory.note)
    return Cell("fits" if d.memory.fits else "does not fit",
                f"{_g(d.memory.per_device_gb, 3)} of {_g(d.memory.budget_gb, 3)} GB per device", note=d.memory.note)


def _load_cell(d: DeploymentDecision, key: str) -> Cell:
    """A throughput or latency figure at the workload's concurrency (the registry's workload suite measured it)."""
    if d.cost is None:
        from evalkit.suites import workload_suite

        measures = workload_suite()
        return Cell("–", f"no {measures.name if measures else 'workload'} suite")
    v = getattr(d.cost, key)
    return Cell(_g(v), "" if d.cost.measured else d.cost.how)  # interpolated or missing: say so


def decision_table(sc: ScenarioDecision, margins: dict[str, float], key: str = "decision", caption: bool = False) -> Table:
    c = sc.workload.get("concurrency")
    header = ["deployment", "KV cache", "qualifies", "memory at this load", f"tokens/s at {c} concurrent", "median TTFT (ms)"]
    header += [f"{k} (margin {v:g})" for k, v in margins.items()]
    rows = []
    for d in sc.deployments:
        status = "recommended ★" if d.deployment == sc.recommended else "yes" if d.qualifies else "no"
        kv = d.memory.kv_precision if d.memory and d.memory.kv_precision else "–"
        rows.append([Cell(d.deployment, "(reference)" if d.reference else ""), Cell(kv), Cell(status, "; ".join(d.reasons)),
                     _memory_cell(d), _load_cell(d, "tokens_per_s"), _load_cell(d, "ttft_ms")]
                    + [_margin_cell(m) for m in d.margins])
    return Table(key, f"Workload: {_workload(sc)}", header, rows, caption=sc.summary if caption else "")


def _workload(sc: ScenarioDecision) -> str:
    w = sc.workload
    out = f"{w['concurrency']} concurrent, {w['context_tokens']:,} tokens of context"
    if w.get("max_ttft_ms"):
        out += f", TTFT ≤ {w['max_ttft_ms']:g} ms"
    if w.get("min_tokens_per_s"):
        out += f", ≥ {w['min_tokens_per_s']:g} tokens/s per request"
    return out


def scenarios_table(decision: Decision) -> Table:
    rows = [[Cell(sc.name), Cell(_workload(sc)), Cell(sc.recommended or "none"), Cell(sc.summary)] for sc in decision.scenarios]
    return Table("decision-scenarios", "Recommendation per workload", ["scenario", "workload", "recommended", "why"], rows)


def pareto_plot(decision: Decision) -> P.Plot | None:
    """Per margin: quality (estimate, interval, margin line) against throughput at the stated load;
    marker area = memory per device. The Pareto front (more throughput, less loss) is joined by a line."""
    sc = decision.primary
    pts = [d for d in sc.deployments if d.cost and d.cost.tokens_per_s is not None]
    if not pts or not decision.margins:
        return None
    keys = list(decision.margins)
    mems = [d.memory.per_device_gb for d in pts if d.memory and d.memory.per_device_gb]
    top = max(mems) if mems else 1.0
    panels = []
    for key in keys:
        marks: list[dict[str, Any]] = []  # drawn in this order (it sets the layering and the legend)
        xs, ys = [], []
        basis = next((m.basis for d in sc.deployments for m in d.margins if m.key == key and m.decision != "reference"),
                     "difference")
        for i, d in enumerate(pts):
            m = next(m for m in d.margins if m.key == key)
            cost = d.cost
            assert cost is not None and cost.tokens_per_s is not None  # pts holds only deployments with a throughput
            x = float(cost.tokens_per_s)
            # the reference sits at 0 on a difference; a value-only metric (a ratio) has none for it: a line
            y = (0.0 if basis == "difference" else None) if m.decision == "reference" else m.estimate
            size = 40 + 400 * ((d.memory.per_device_gb or 0) / top if d.memory and d.memory.per_device_gb else 0)
            color = P.REFERENCE_COLOR if d.reference else P.PALETTE[i % len(P.PALETTE)]
            if y is None:
                marks.append({"x": x, "color": color, "reference": f"{d.deployment} (reference)"})
                continue
            y = float(y)
            err = None
            if m.ci_low is not None and m.ci_high is not None:
                # max(0, ...): an exact test's interval need not contain the point estimate
                err = [max(0.0, y - m.ci_low), max(0.0, m.ci_high - y)]
            best = d.deployment == sc.recommended
            marks.append({"x": x, "y": y, "err": err, "size": size, "color": color, "alpha": 0.75 if d.qualifies else 0.3,
                          "best": best, "name": d.deployment, "label": d.deployment + (" ★" if best else "")})
            xs.append(x)
            ys.append(y)
        direction = next((m.direction for d in pts for m in d.margins if m.key == key), "higher")
        panels.append({"marks": marks, "front": _front(xs, ys, direction), "margin": float(decision.margins[key]),
                       "xlabel": f"output tokens/s at {sc.workload['concurrency']} concurrent",
                       "ylabel": f"{key} ({'Δ vs reference' if basis == 'difference' else 'value'}; "
                                 f"{'higher' if direction == 'higher' else 'lower'} is better)"})
    return P.Plot("decision", "Quality against throughput at the stated load (marker area: memory per device)",
                  P.drawn("decision", {"panels": panels}, _draw_pareto),
                  "Scatter of each margin's estimate with its interval against throughput; marker size is memory")


def _draw_pareto(spec: dict[str, Any]) -> bytes:
    panels = spec["panels"]
    fig, axes = P.figure(4.2 * len(panels) + 0.6, 3.4, ncols=len(panels))
    for ax, panel in zip(axes, panels):
        for mk in panel["marks"]:
            x, color = mk["x"], mk["color"]
            if "reference" in mk:
                ax.axvline(x, color=color, ls=":", lw=1)
                ax.annotate(mk["reference"], (x, 0.02), xycoords=("data", "axes fraction"), fontsize=7, rotation=90)
                continue
            y, err = mk["y"], mk["err"]
            ax.errorbar([x], [y], yerr=None if err is None else np.array([[err[0]], [err[1]]]), fmt="none", ecolor=color,
                        elinewidth=1.2, capsize=3)
            ax.scatter([x], [y], s=mk["size"], color=color, alpha=mk["alpha"], edgecolors="black" if mk["best"] else color,
                       linewidths=2 if mk["best"] else 0.5, label=mk["label"])
            ax.annotate(mk["name"], (x, y), textcoords="offset points", xytext=(6, 6), fontsize=7)
        front = panel["front"]
        if len(front) > 1:
            ax.plot(*zip(*front), "-", color="#888888", lw=1, zorder=0)
        margin = panel["margin"]
        ax.axhline(margin, color="#cc0000", ls="--", lw=1)
        ax.annotate(f"margin {margin:g}", (0.01, margin), xycoords=("axes fraction", "data"),
                    fontsize=7, color="#cc0000", va="bottom")
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"], fontsize=8)
        ax.grid(alpha=0.3)
    P.legend(fig, max(axes, key=lambda a: len(a.get_legend_handles_labels()[0])))  # the panel naming the most
    return P.png(fig)


def _front(xs: list[float], ys: list[float], direction: str) -> list[tuple[float, float]]:
    """Points no other point beats on both throughput and quality, by throughput."""
    sign = 1.0 if direction == "higher" else -1.0
    pts = list(zip(xs, ys))
    keep = [p for p in pts if not any(q != p and q[0] >= p[0] and sign * q[1] >= sign * p[1] for q in pts)]
    return sorted(keep)


def decision_parts(decision: Decision | None) -> dict[str, Any] | None:
    """What the template and report.md show; None when the run has no `decision:`."""
    if decision is None:
        return None
    tables = [decision_table(decision.primary, decision.margins)]
    if len(decision.scenarios) > 1:
        tables += [scenarios_table(decision)] + [decision_table(sc, decision.margins, f"decision-{i}", caption=True)
                                                for i, sc in enumerate(decision.scenarios[1:], 1)]
    plot = pareto_plot(decision)
    change = decision.primary.what_would_change
    return {"summary": decision.summary, "rule": decision.rule, "test": decision.test, "tables": tables,
            "plots": [plot] if plot else [], "what_would_change": change}
