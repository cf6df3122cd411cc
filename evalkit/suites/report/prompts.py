"""The prompt suite in the report: its section (scores, plot, examples), verdict columns and BLEU signatures.

Drawn by the report from the suite's `SuiteSpec` (`report`, `verdict`): the report itself knows no suite.
"""
from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from evalkit.report.cells import CATEGORIES, CATEGORY_LABEL, Cell, Example, Table, better_note, cut
from evalkit.report.render import Section, some
from evalkit.report.tables import metric_table
from evalkit.report.verdict import Column
from evalkit.report.view import RunView
from evalkit.report.plots import Plot, dots, drawn, figure, legend, png, style, triple

SUITE = "prompts"


def translation_langs(view: RunView, prefix: str) -> list[str]:
    s = view.suite_scores("prompts")
    if s.empty:
        return []
    return sorted({str(m)[len(prefix):] for m in s.metric if str(m).startswith(prefix)})

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
    spec = {"style": style(view), "panels": [
        {"groups": [c[0] for c in cols], "ylabel": ylabel, "scale": scale,
         "values": {d: [triple(view.score(d, "prompts", cat, m)) for _, cat, m in cols] for d in view.deployments}}
        for cols, ylabel, scale in panels]}
    return Plot("prompts-categories", "Prompt suite: score by category (95% intervals)",
                drawn("prompts-categories", spec, _draw_prompts),
                "Dot plot of each deployment's score per prompt category with interval bars")

def _draw_prompts(spec: dict[str, Any]) -> bytes:
    panels = spec["panels"]
    fig, axes = figure(4.2 * len(panels) + 0.6, 3.2, ncols=len(panels))
    for ax, panel in zip(axes, panels):
        dots(ax, spec["style"], panel["groups"], panel["values"], panel["scale"])
        ax.set_ylabel(panel["ylabel"])
        ax.set_ylim(-3, 103)
    legend(fig, axes[0])
    fig.suptitle("Prompt suite: score by category with 95% intervals", fontsize=11)
    return png(fig)

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
            texts = {(by_item[item_id].get(d) or {}).get("generation", {}).get("output_text", "").strip() for d in view.deployments}
            ref_ok = v[view.reference] == "pass" and "fail" in v.values()
            return (-int(ref_ok), -len(set(v.values()) - {""}) - len(texts), item_id)

        for item_id in sorted(ids, key=disagreement)[:per_category]:
            per = by_item[item_id]
            first = per.get(view.reference) or next(iter(per.values()))
            out.append(Example(f"{item_id} ({CATEGORY_LABEL[cat]})", cut(first.get("prompt", "")),
                               [(d, outcomes.get((item_id, d), ""), cut(per[d].get("generation", {}).get("output_text", "")))
                                for d in view.deployments if d in per]))
    return out

def bleu_signatures(view: RunView) -> dict[str, dict[str, str]]:
    """sacrebleu signatures per target language: describe()'s when it gave them, else from the metrics used."""
    info = view.suite_info.get("prompts", {}).get("bleu_signatures")
    if isinstance(info, dict) and info:
        return info
    langs = sorted({m.split("_en-")[1] for m in view.suite_scores("prompts").get("metric", pd.Series(dtype=str))
                    if "_en-" in str(m)})
    if not langs:
        return {}
    from evalkit.metrics.bleu import metrics_for

    out: dict[str, dict[str, str]] = {}
    for lang in langs:
        sigs = {}
        for name, metric in metrics_for(lang).items():
            metric.corpus_score(["a"], [["a"]])  # sacrebleu fills the reference count in on first use
            sigs[name] = str(metric.get_signature())
        out[lang] = sigs
    return out


def section(view: RunView) -> Section:
    return Section(SUITE, "Prompts: code, reasoning, translation, QA",
                   "Automatic scores per category; BLEU and chrF are sacrebleu's (signatures below).",
                   [prompts_table(view)], some(prompts_plot(view)), prompt_examples(view))


def verdict_columns(view: RunView) -> list[Column]:
    """The automatic scores per category (left out when human ratings replace them), then BLEU per language."""
    cols: list[Column] = []
    if view.has(SUITE) and view.human.get("absolute", pd.DataFrame()).empty:
        group = "prompts (automatic)"
        for cat in CATEGORIES:
            if cat == "code":
                cols.append(Column(group, "code pass@1", _cells(view, "code", "pass@1"), "code pass@1"))
            elif cat == "translation":
                for lang in translation_langs(view, "chrf_en-"):
                    cols.append(Column(group, f"chrF en-{lang}", _cells(view, "translation", f"chrf_en-{lang}"),
                                       f"translation chrF en-{lang}"))
            else:
                cols.append(Column(group, CATEGORY_LABEL[cat], _cells(view, cat, "contains"), f"{CATEGORY_LABEL[cat]} correct"))
    for lang in translation_langs(view, "bleu_en-"):
        cols.append(Column("BLEU", f"en-{lang}", _cells(view, "translation", f"bleu_en-{lang}")))
    return cols


def _cells(view: RunView, category: str, metric: str) -> Callable[[str], Cell]:
    """deployment -> its cell of this suite's `metric` in `category`."""
    return lambda d: view.cell(d, SUITE, category, metric)


def signatures(view: RunView, info: dict[str, Any]) -> list[tuple[str, str]]:
    """sacrebleu's signatures first, then the rest of describe()."""
    from evalkit.report.tables import flatten

    rows = [(f"prompts · {name} en-{lang}", str(sig)) for lang, sigs in bleu_signatures(view).items() for name, sig in sigs.items()]
    return rows + [(f"prompts · {k}", v) for k, v in flatten(info) if not k.startswith("bleu_signatures")]
