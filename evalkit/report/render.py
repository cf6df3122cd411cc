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

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from evalkit.report import plots as P
from evalkit.report import tables as T
from evalkit.report.cells import CATEGORIES, CATEGORY_LABEL, Example, Table, marks
from evalkit.report.verdict import how_sure, verdict
from evalkit.report.view import RunView
from evalkit.results import Run
from evalkit.store import RunDir, atomic_write_bytes, atomic_write_text

TEMPLATES = Path(__file__).parent / "templates"
FILES_DIR = "report_files"
EXAMPLE_CHARS = 1500  # longer outputs are cut (the full text is in records/ and items/)


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


def _outcome(row: pd.Series) -> str:
    """"pass" / "fail" from a per-item row (code: tests passed; reasoning, QA: answer found), else ""."""
    for col in ("pass", "contains", "passed", "correct"):
        if col in row and pd.notna(row[col]):
            return "pass" if str(row[col]).lower() in ("1", "1.0", "true") else "fail"
    return ""


def prompt_examples(view: RunView, per_category: int = 2) -> list[Example]:
    """Per category, the items where deployments disagree most (reference right, another wrong) first."""
    recs = view.records("prompts")
    items = view.items("prompts")
    if items.empty:
        return []
    # to_dict, not itertuples: a column named "pass" (a keyword) would be renamed there
    outcomes = {(r["item_id"], r["deployment"]): _outcome(pd.Series(r)) for r in items.to_dict("records")}
    by_item: dict[str, dict[str, dict[str, Any]]] = {}
    for dep, rs in recs.items():
        for r in rs:
            by_item.setdefault(r["item_id"], {})[dep] = r
    out: list[Example] = []
    for cat in CATEGORIES:
        ids = sorted(i for i, per in by_item.items() if next(iter(per.values()))["category"] == cat)

        def disagreement(item_id: str) -> tuple[int, int, str]:
            v = {d: outcomes.get((item_id, d), "") for d in view.deployments}
            texts = {(by_item[item_id].get(d) or {}).get("output_text", "").strip() for d in view.deployments}
            ref_ok = v[view.reference] == "pass" and "fail" in v.values()
            return (-int(ref_ok), -len(set(v.values()) - {""}) - len(texts), item_id)

        for item_id in sorted(ids, key=disagreement)[:per_category]:
            per = by_item[item_id]
            first = per.get(view.reference) or next(iter(per.values()))
            out.append(Example(f"{item_id} ({CATEGORY_LABEL[cat]})", _cut(first.get("prompt", "")),
                               [(d, outcomes.get((item_id, d), ""), _cut(per[d].get("output_text", "")))
                                for d in view.deployments if d in per]))
    return out


def longcontext_examples(view: RunView) -> list[Example]:
    """The repetition continuation at the longest length each deployment ran, side by side."""
    recs = view.records("longcontext")
    done = {d: [r for r in rs if r.get("kind") == "rep" and "skipped" not in r] for d, rs in recs.items()}
    lengths = [max((r["length_target"] for r in rs), default=0) for rs in done.values() if rs]
    if not lengths:
        return []
    longest = min(lengths)  # the longest length every deployment reached
    outs = [(d, "", _cut(r.get("output_text", ""))) for d, rs in done.items() for r in rs if r["length_target"] == longest]
    return [Example(f"continuation after {longest} tokens of context", "", outs)]


def _cut(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + f" …[{len(text) - EXAMPLE_CHARS} more characters]"


def _some(*plots: P.Plot | None) -> list[P.Plot]:
    return [p for p in plots if p is not None]


def sections(view: RunView) -> list[Section]:
    out: list[Section] = []
    if view.has("prompts"):
        out.append(Section("prompts", "Prompts: code, reasoning, translation, QA",
                           "Automatic scores per category; BLEU and chrF are sacrebleu's (signatures below).",
                           [T.prompts_table(view)], _some(P.prompts_plot(view)), prompt_examples(view)))
    if view.human:
        out.append(Section("human", "Human ratings",
                           "Blind ratings imported from the rating sheets, de-blinded with the run's key.",
                           T.human_tables(view), _some(P.human_plot(view))))
    if view.has("perplexity"):
        out.append(Section("perplexity", "Perplexity and distribution drift", "",
                           [T.perplexity_table(view), T.llama_block_table(view)], _some(P.perplexity_plot(view))))
    if view.has("mmlu"):
        flipped = T.flipped_items(view, "mmlu")
        out.append(Section("mmlu", f"{view.mmlu_label}: multiple choice",
                           "" if view.mmlu_label == "MMLU" else "evalkit's built-in multiple-choice set, not MMLU.",
                           [T.mmlu_subject_table(view), T.flips_table(view, "mmlu", "all", "questions")],
                           _some(P.mmlu_plot(view)), details=[flipped] if not flipped.empty else []))
    if view.has("longcontext"):
        out.append(Section("longcontext", "Long context: repetition and recall", "",
                           T.longcontext_tables(view), P.longcontext_plots(view), longcontext_examples(view)))
    if view.has("humaneval"):
        flipped = T.flipped_items(view, "humaneval")
        out.append(Section("humaneval", "HumanEval", "", [T.humaneval_table(view), T.flips_table(view, "humaneval", "code", "tasks")],
                           details=[flipped] if not flipped.empty else []))
    if view.has("cost"):
        out.append(Section("cost", "Cost: speed and memory", "",
                           T.cost_tables(view), _some(P.cost_plot(view))))
    if view.run.manifest.get("ledger"):
        out.append(Section("ledger", "Memory ledger", "What “evalkit plan” predicted before loading, beside what was measured.",
                           [T.ledger_table(view)], _some(P.ledger_plot(view))))
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
