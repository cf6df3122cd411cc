"""Render report.html (one self-contained file) and report.md from what scoring wrote. Nothing is recomputed.

The HTML has no scripts and a Content-Security-Policy that forbids them; plots are embedded base64 PNGs.
Model output reaches it only through Jinja2 autoescaping (never `|safe`): a model that writes <script>
shows text. report.md mirrors the same tables; its plots are PNG files in report_files/ beside it, and
model output sits in fenced code blocks so Markdown viewers do not interpret it either.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from evalkit.report import plots as P
from evalkit.report import tables as T
from evalkit.report.cells import Example, Table, marks
from evalkit.report.verdict import how_sure, verdict
from evalkit.report.view import RunView
from evalkit.results import Run
from evalkit.store import RunDir, atomic_write_bytes, atomic_write_text
from evalkit.suites import SuiteSpec, all_specs, load_hook

TEMPLATES = Path(__file__).parent / "templates"
FILES_DIR = "report_files"


@dataclass
class Section:
    key: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    plots: list[P.Plot] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)
    details: list[Table] = field(default_factory=list)  # long tables, collapsed in HTML


# -- sections ----------------------------------------------------------------------------------


def some(*plots: P.Plot | None) -> list[P.Plot]:
    return [p for p in plots if p is not None]


def suite_section(view: RunView, spec: SuiteSpec) -> Section | None:
    """A suite's section: its own (`SuiteSpec.report`), else a table of its declared metrics by category."""
    if not view.has(spec.name):
        return None
    if spec.report is not None:
        return load_hook(spec.report)(view)
    return Section(spec.name, spec.label, "", [T.declared_metrics_table(view, spec)])


def sections(view: RunView) -> list[Section]:
    out: list[Section] = []
    specs = all_specs()
    for spec in specs:  # in registry order; a suite scored from the run directory's files follows the one it grades
        if not spec.runs:
            continue
        section = suite_section(view, spec)
        if section is not None:
            out.append(section)
        if spec.rated_outputs:  # human ratings and a model judge's grades of its outputs (SuiteSpec.runs False)
            graded = [load_hook(g.report)(view) for g in specs if not g.runs and g.report is not None]
            out += [s for s in graded if s is not None]
    if view.run.manifest.get("ledger"):
        out.append(Section("ledger", "Memory ledger", "What “evalkit plan” predicted before loading, beside what was measured.",
                           [T.ledger_table(view)], some(P.ledger_plot(view))))
    out.append(Section("hardware", "What the hardware really ran", "", [T.hardware_table(view)] + T.parity_tables(view)))
    out.append(Section("environment", "Environment and signatures", "",
                       [T.environment_table(view), T.engines_table(view), T.signatures_table(view)]))
    appendix = T.all_numbers(view)
    if appendix:
        out.append(Section("numbers", "All numbers", "Every row of scores.csv and comparisons.csv.", details=appendix))
    return out


def context(run: Run) -> dict[str, Any]:
    view = RunView(run)
    table = verdict(view)
    m = run.manifest
    from evalkit.report.decision_section import decision_parts

    warnings = T.warnings(view)
    try:
        decision = decision_parts(run.decision)
    except Exception as e:  # the decision section must never cost the run its report
        decision = None
        warnings.append(("decision", f"decision section not rendered ({type(e).__name__}: {e}); see decision.json"))
    return {
        "run": run, "manifest": m, "decision": decision, "verdict": table, "sure": how_sure(view, table), "warnings": warnings,
        "marks": marks(view.level), "sections": [s for s in sections(view) if s.tables or s.plots or s.examples or s.details],
        "suites": [k for k, v in ((m.get("config") or {}).get("suites") or {}).items() if v is not None],
    }


# -- Markdown ----------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    # Markdown viewers may render raw HTML: escape it; keep cells on one line.
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def md_table(t: Table) -> list[str]:
    out = [f"### {t.title}", ""] if t.title else []
    out += ["| " + " | ".join(_md_cell(h) for h in t.header) + " |", "|" + "---|" * len(t.header)]
    out += ["| " + " | ".join(_md_cell(c.text()) for c in row) + " |" for row in t.rows]
    if t.caption:
        out += ["", f"_{_md_cell(t.caption)}_"]
    return out + [""]


def _fence(text: str) -> list[str]:
    """A fenced block longer than any backtick run in the text: its content is never interpreted."""
    run, longest = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", text, fence]


def render_markdown(ctx: dict[str, Any]) -> str:
    run: Run = ctx["run"]
    m = ctx["manifest"]
    lines = [f"# evalkit report — run {run.run_id}", "",
             f"Created {m.get('created', '–')}; reference **{run.reference}**; suites: {', '.join(ctx['suites'])}.", ""]
    lines += [f"> **Warning — {_md_cell(name)}:** {_md_cell(w)}" for name, w in ctx["warnings"]]
    if ctx.get("decision"):
        d = ctx["decision"]
        lines += ["", "## Decision", "", f"**{_md_cell(d['summary'])}**", ""]
        for t in d["tables"]:
            lines += md_table(t)
        lines += [f"![{p.title}]({FILES_DIR}/{p.key}.png)" for p in d["plots"]] + [""]
        if d["what_would_change"]:
            lines += ["What would change that:", ""] + [f"- {_md_cell(x)}" for x in d["what_would_change"]] + [""]
        lines += [f"_Rule: {_md_cell(d['rule'])} Test: {_md_cell(d['test'])}._", ""]
    lines += ["", "## Verdict", ""] + md_table(replace(ctx["verdict"], title=""))
    lines += ["Legend: " + "; ".join(f"{sym} {text}" for sym, text in ctx["marks"].values()), ""]
    lines += ["**How sure are we?**", ""] + [f"- **{s.deployment}**: {s.text}" for s in ctx["sure"]] + [""]
    for s in ctx["sections"]:
        lines += [f"## {s.title}", ""] + ([s.intro, ""] if s.intro else [])
        for t in s.tables + s.details:
            lines += md_table(t)
        for p in s.plots:
            lines += [f"![{p.title}]({FILES_DIR}/{p.key}.png)", ""]
        for ex in s.examples:
            lines += [f"### Example: {_md_cell(ex.title)}", ""]
            if ex.prompt:
                lines += ["Prompt:", ""] + _fence(ex.prompt) + [""]
            for dep, outcome, text in ex.outputs:
                lines += [f"**{dep}**" + (f" ({outcome})" if outcome else "") + ":", ""] + _fence(text) + [""]
    return "\n".join(lines).rstrip() + "\n"


# -- writing -----------------------------------------------------------------------------------


def figure_memo_dir(manifest: dict[str, Any]) -> Path | None:
    """Where the report keeps figures by what they show (evalkit.report.plots): the result cache's `figures/`,
    for runs that use the cache."""
    if not manifest.get("use_cache"):
        return None
    from evalkit.models import cache_dir

    return cache_dir() / "figures"


def environment() -> Environment:
    # autoescape for every template (not only by extension): model text can never reach HTML unescaped
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True),
                       trim_blocks=True, lstrip_blocks=True)


def render_report(run_dir: RunDir | Path | str) -> Path:
    """Write report.html, report.md and report_files/*.png into the run directory; returns report.html."""
    path = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
    run = Run(path)
    with P.figure_memo(figure_memo_dir(run.manifest)):  # figures showing the same numbers are not drawn again
        ctx = context(run)
    atomic_write_text(run.path / "report.html", environment().get_template("report.html.j2").render(**ctx))
    files = run.path / FILES_DIR
    plots = [p for s in ctx["sections"] for p in s.plots] + (ctx["decision"]["plots"] if ctx.get("decision") else [])
    for p in plots:
        atomic_write_bytes(files / f"{p.key}.png", p.png)
    for stale in files.glob("*.png") if files.exists() else []:
        if stale.stem not in {p.key for p in plots}:
            stale.unlink()  # a plot whose data are gone must not linger beside report.md
    atomic_write_text(run.path / "report.md", render_markdown(ctx))
    return run.path / "report.html"


__all__ = ["render_report", "context", "render_markdown"]
