"""The report's figures as PNG bytes (matplotlib, Agg canvas; no pyplot global state, no display needed).

Every figure is drawn from the same frames the tables use (RunView): nothing is recomputed. Each function
returns None or [] when its data are absent, so a run with one suite renders only that suite's plots.

Figures drawn from a plain spec (`drawn`: the numbers, labels and colours a figure shows) are kept by the
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
from evalkit.report.cells import CATEGORIES, CATEGORY_LABEL, isnum
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


@lru_cache(maxsize=None)
def _drawing_code(module: str) -> str:
    """What else a kept figure depends on: the drawing code (this module, the decision section's and the module
    of the drawing function: a suite's report module) and matplotlib's version."""
    import sys
    from importlib.metadata import version  # not matplotlib.__version__: that imports matplotlib

    code = hashlib.sha256()
    for path in (Path(__file__).parent / "plots.py", Path(__file__).parent / "decision_section.py"):
        code.update(path.read_bytes())
    source = getattr(sys.modules.get(module), "__file__", None)
    if source and Path(source).name not in ("plots.py", "decision_section.py"):
        code.update(Path(source).read_bytes())
    return code.hexdigest() + " matplotlib " + version("matplotlib")


def drawn(kind: str, spec: dict[str, Any], draw: Callable[[dict[str, Any]], bytes]) -> bytes:
    """draw(spec), or the PNG kept for the same (kind, spec) by the same drawing code."""
    module = getattr(draw, "__module__", "") or ""
    return _FIGURES.answer(lambda: json.dumps([FIGURE_FORMAT, kind, spec, _drawing_code(module)], sort_keys=True),
                           lambda: draw(spec))


def style(view: RunView) -> dict[str, Any]:
    """The deployments in order with their colours and legend labels: the part of a spec every figure shares."""
    return {"deployments": list(view.deployments), "colors": colors(view),
            "labels": {d: _label(view, d) for d in view.deployments}}


# -- drawing -------------------------------------------------------------------------------------


def figure(width: float, height: float, ncols: int = 1, nrows: int = 1) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})  # no version stamp: stable bytes
    return buf.getvalue()


def legend(fig: Figure, ax: Axes) -> None:
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


def dots(ax: Axes, style: dict[str, Any], groups: Sequence[str], values: dict[str, Sequence[Sequence[float]]],
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


def triple(row: Any) -> tuple[float, float, float]:
    if row is None:
        return (math.nan, math.nan, math.nan)
    g = row.get
    return (float(g("value")) if isnum(g("value")) else math.nan,
            float(g("ci_low")) if isnum(g("ci_low")) else math.nan,
            float(g("ci_high")) if isnum(g("ci_high")) else math.nan)


# -- prompts -----------------------------------------------------------------------------------


# -- human ratings -----------------------------------------------------------------------------


def human_plot(view: RunView) -> Plot | None:
    absolute = view.human.get("absolute", pd.DataFrame())
    pairwise = view.human.get("pairwise", pd.DataFrame())
    if absolute.empty and pairwise.empty:
        return None
    n = int(not absolute.empty) + int(not pairwise.empty)
    fig, axes = figure(4.6 * n + 0.4, 3.2, ncols=n)
    i = 0
    if not absolute.empty:
        cats = [c for c in list(CATEGORIES) + ["all"] if c in set(absolute.category)]
        vals: dict[str, Sequence[Sequence[float]]] = {}
        for d in view.deployments:
            a = absolute[absolute.deployment == d].set_index("category")
            if a.empty:
                continue
            vals[d] = [(a.at[c, "mean"], a.at[c, "ci_low"], a.at[c, "ci_high"]) if c in a.index else (math.nan,) * 3
                       for c in cats]
        dots(axes[i], style(view), [CATEGORY_LABEL[c] for c in cats], vals)
        axes[i].set_ylim(0.8, 5.2)
        axes[i].set_ylabel("mean rating (1–5)")
        axes[i].set_title("Mean human rating", fontsize=10)
        legend(fig, axes[i])
        i += 1
    if not pairwise.empty:
        ax = axes[i]
        p = pairwise[pairwise.category == "all"]
        y = np.arange(len(p))
        left = np.zeros(len(p))
        for col, color, label in (("win_rate", "#2ca02c", "win"), ("tie_rate", "#bbbbbb", "tie"), ("loss_rate", "#d62728", "loss")):
            v = p[col].to_numpy(float) * 100
            ax.barh(y, v, left=left, color=color, label=label)
            for yy, lo, vv in zip(y, left, v):
                if vv >= 8:
                    ax.text(lo + vv / 2, float(yy), f"{vv:.0f}%", ha="center", va="center", fontsize=8, color="white" if label != "tie" else "black")
            left += v
        ax.set_yticks(y, list(p.deployment))
        ax.set_xlim(0, 100)
        ax.set_xlabel(f"% of side-by-side ratings vs {view.reference}")
        ax.set_title("Win / tie / loss against the reference", fontsize=10)
        ax.set_ylim(len(p) - 0.5 + 0.7, -0.5)  # headroom below the last bar for the legend
        ax.legend(fontsize=8, ncols=3, loc="lower center", frameon=False)
    return Plot("human-ratings", "Human ratings: means with 95% intervals; win/tie/loss", png(fig),
                "Mean human ratings per category with intervals, and stacked win/tie/loss bars per deployment")


# -- perplexity --------------------------------------------------------------------------------

# -- MMLU --------------------------------------------------------------------------------------


# -- long context ------------------------------------------------------------------------------


# -- cost and memory -----------------------------------------------------------------------------


def ledger_plot(view: RunView) -> Plot | None:
    ledger = view.run.manifest.get("ledger") or []
    rows = [(r["deployment"], (r.get("per_device_bytes") or 0) / 1e9, measured_peak(view, r["deployment"]))
            for r in ledger]
    if not rows:
        return None
    spec = {"deployments": [r[0] for r in rows], "predicted": [float(r[1]) for r in rows],
            "measured": [float(r[2][0]) / 1e9 if r[2] else 0 for r in rows],
            "budget": max((r.get("device_budget_bytes") or 0) for r in ledger) / 1e9}
    return Plot("ledger", "Memory: predicted vs measured", drawn("ledger", spec, _draw_ledger),
                "Bars of predicted and measured memory per deployment")


def _draw_ledger(spec: dict[str, Any]) -> bytes:
    fig, axes = figure(6.0, 0.45 * len(spec["deployments"]) + 1.5)
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
    legend(fig, ax)
    return png(fig)
