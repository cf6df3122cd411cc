"""Render report.md and a self-contained report.html from what scoring wrote. Nothing is recomputed here.

All model output reaches HTML through Jinja2 autoescaping: a model that writes <script> shows text.
"""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from evalkit.results import Run
from evalkit.store import RunDir, atomic_write_text

TEMPLATES = Path(__file__).parent / "templates"

# The verdict table: one column per headline metric, as in the field comparison (MOTIVATION.md).
VERDICT_COLUMNS: list[tuple[str, str, str, str]] = [
    # (label, suite, category, metric)
    ("code pass@1", "prompts", "code", "pass@1"),
    ("reasoning", "prompts", "reasoning", "contains"),
    ("translation chrF en-de", "prompts", "translation", "chrf_en-de"),
    ("translation BLEU en-zh", "prompts", "translation", "bleu_en-zh"),
    ("QA", "prompts", "qa", "contains"),
    ("PPL", "perplexity", "text", "ppl"),
    ("KLD", "perplexity", "text", "kld_mean"),
    ("MMLU", "mmlu", "all", "accuracy"),
    ("flips", "mmlu", "all", "flips"),
    ("HumanEval", "humaneval", "code", "pass@1"),
    ("seq-rep-4 (longest)", "longcontext", "longest", "seq_rep_4"),
    ("tok/s @1", "cost", "c1", "tokens_per_s"),
]


def fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def _lookup(df: pd.DataFrame, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
    if df.empty:
        return None
    m = df[(df.deployment == dep) & (df.suite == suite) & (df.metric == metric)]
    if category == "longest" and not m.empty:
        m = m[m.category.str.startswith("L")]
        if not m.empty:
            m = m.loc[[m.category.str[1:].astype(int).idxmax()]]
    elif category != "*":
        m = m[m.category == category]
    return None if m.empty else m.iloc[0]


def verdict_table(run: Run) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """Rows = deployments; cells = value, interval, difference from the reference and significance."""
    scores, comps = run.scores, run.comparisons
    cols = [c for c in VERDICT_COLUMNS if any(_lookup(scores, d, *c[1:]) is not None or _lookup(comps, d, *c[1:]) is not None for d in run.deployments)]
    rows = []
    for dep in run.deployments:
        cells: list[dict[str, Any]] = [{"text": dep + (" (reference)" if dep == run.reference else "")}]
        for _, suite, cat, metric in cols:
            s = _lookup(scores, dep, suite, cat, metric)
            c = _lookup(comps, dep, suite, cat, metric) if dep != run.reference else None
            text = fmt(s["value"]) if s is not None else (fmt(c["value"]) if c is not None else "–")
            ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if s is not None and pd.notna(s.get("ci_low")) else ""
            diff = ""
            sig = None
            if c is not None:
                diff = f"Δ {float(c['diff']):+.3g}"
                if pd.notna(c.get("ci_low")):
                    diff += f" [{fmt(c['ci_low'])}, {fmt(c['ci_high'])}]"
                sig = bool(c["significant"])
            cells.append({"text": text, "ci": ci, "diff": diff, "significant": sig})
        rows.append(cells)
    return ["deployment"] + [c[0] for c in cols], rows


def plots(run: Run) -> list[dict[str, str]]:
    try:
        from evalkit.report.plots import all_plots
    except ImportError:
        return []
    return all_plots(run)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def context(run: Run) -> dict[str, Any]:
    header, rows = verdict_table(run)
    manifest = run.manifest
    hardware = []
    for name in run.deployments:
        dep = manifest["deployments"][name]
        hw = dep.get("hardware") or {}
        hardware.append({
            "name": name, "engine": dep["engine"], "source": dep["source"], "variant": dep.get("variant") or "–",
            "sha256": dep["sha256"][:16], "size_mb": f"{dep['size_bytes'] / 1e6:.1f}",
            "device": hw.get("device", "–"), "precision": hw.get("effective_precision", "–"),
            "explanation": hw.get("explanation", ""), "warning": hw.get("warning"),
        })
    suites: dict[str, pd.DataFrame] = {}
    if not run.scores.empty:
        for suite, df in run.scores.groupby("suite", sort=False):
            suites[str(suite)] = df
    parity_path = run.path / "parity.csv"
    parity = pd.read_csv(parity_path) if parity_path.exists() and parity_path.stat().st_size else pd.DataFrame()
    return {
        "run": run, "manifest": manifest, "verdict_header": header, "verdict_rows": rows, "hardware": hardware,
        "suites": suites, "comparisons": run.comparisons, "plots": plots(run), "parity": parity, "fmt": fmt,
        "examples": _examples(run),
        "engines": run.engines.to_dict("records") if not run.engines.empty else [],
    }


def _examples(run: Run, per_category: int = 2) -> list[dict[str, Any]]:
    """A few prompts with every deployment's output side by side (escaped on rendering)."""
    recs = run.records
    if recs.empty or "suite" not in recs:
        return []
    prompts = recs[recs.suite == "prompts"]
    out = []
    for cat, group in prompts.groupby("category"):
        for item_id in sorted(group.item_id.unique())[:per_category]:
            rows = group[group.item_id == item_id]
            out.append({
                "item_id": item_id, "category": cat, "prompt": rows.iloc[0]["prompt"],
                "outputs": [(r.deployment, r.output_text) for r in rows.itertuples()],
            })
    return out


def render_markdown(ctx: dict[str, Any]) -> str:
    run: Run = ctx["run"]
    lines = [f"# evalkit report — run {run.run_id}", "", f"Reference: **{run.reference}**. Differences are deployment − reference on the same items, "
             "with 95% intervals; ✱ marks a difference distinguishable from noise (p < 0.05).", "", "## Verdict", ""]
    table = [[c["text"] + (f" {c['ci']}" if c.get("ci") else "") + (f" ({c['diff']}{' ✱' if c.get('significant') else ''})" if c.get("diff") else "")
              for c in row] for row in ctx["verdict_rows"]]
    lines += [_md_table(ctx["verdict_header"], table), "", "## What the hardware really ran", ""]
    lines += [_md_table(["deployment", "engine", "model", "variant", "device", "effective precision", "note"],
                        [[h["name"], h["engine"], h["source"], h["variant"], h["device"], h["precision"], (h["warning"] or h["explanation"])] for h in ctx["hardware"]])]
    for suite, df in ctx["suites"].items():
        lines += ["", f"## {suite}", ""]
        lines += [_md_table(["deployment", "category", "metric", "value", "95% CI", "n"],
                            [[r.deployment, r.category, r.metric, fmt(r.value), f"[{fmt(r.ci_low)}, {fmt(r.ci_high)}]" if pd.notna(r.ci_low) else "", fmt(r.n)] for r in df.itertuples()])]
    comps = ctx["comparisons"]
    if not comps.empty:
        lines += ["", "## Paired comparisons with the reference", ""]
        lines += [_md_table(["deployment", "suite", "category", "metric", "diff", "95% CI", "p", "n", "method", "significant"],
                            [[r.deployment, r.suite, r.category, r.metric, fmt(r.diff), f"[{fmt(r.ci_low)}, {fmt(r.ci_high)}]", fmt(r.p_value), fmt(r.n), r.method, "yes" if r.significant else "no"] for r in comps.itertuples()])]
    lines += ["", "## Environment", "", f"evalkit {ctx['manifest']['evalkit_version']}; " + ", ".join(f"{k} {v}" for k, v in ctx["manifest"]["environment"]["libraries"].items() if v)]
    return "\n".join(lines) + "\n"


def render_report(run_dir: RunDir) -> None:
    run = Run(run_dir.path)
    ctx = context(run)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    atomic_write_text(run.path / "report.html", env.get_template("report.html.j2").render(**ctx))
    atomic_write_text(run.path / "report.md", render_markdown(ctx))


__all__ = ["render_report", "verdict_table", "html"]
