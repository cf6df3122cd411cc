"""The report's model-judge section: judge scores beside the human ratings, the certification table, the
position flips and the length slopes, and who judged. Read from the run directory (evalkit.judge.score);
nothing is judged here. The judge's reasons are model output: they reach the report only as escaped text
(in the viewer, item by item), never as markup."""
from __future__ import annotations

import math
from typing import Any

from evalkit.judge.score import ALL, JudgeTables, judge_tables
from evalkit.report.cells import Cell, Table, fmt, fmt_interval
from evalkit.report.view import RunView

LABEL = {"code": "Code", "reasoning": "Reasoning", "translation": "Translation", "qa": "QA", ALL: "All"}


def _num(x: Any, digits: int = 2) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "—"
    return f"{v:.{digits}f}" if math.isfinite(v) else "—"


def _interval(lo: Any, hi: Any) -> str:
    got = fmt_interval(lo, hi)
    return got or "(too few items for an interval)"


def _status(t: JudgeTables, category: str) -> str:
    return "certified" if t.certified(category) else "UNCERTIFIED: not in the decision"


def section_parts(view: RunView) -> tuple[str, list[Table]] | None:
    """(intro, tables) of the judge section; None when the run was never judged."""
    t = judge_tables(view.run.path)
    if t is None:
        return None
    ident = t.info.get("identity", {})
    samp = ident.get("sampling", {})
    intro = (f"Judge: {ident.get('deployment')} ({ident.get('engine')}, {ident.get('model_source') or 'served model'}, "
             f"model {str(ident.get('model_identity'))[:16]}…, prompt template {str(ident.get('template_sha256'))[:12]}, "
             f"rubrics {str(ident.get('rubrics_sha256'))[:12]}, temperature {samp.get('temperature')}, seed {samp.get('seed')}). "
             "Judge scores count in the decision only in categories where the judge is certified against the human ratings.")
    if t.family:
        intro += (f" WARNING: the judge is of the same model family as {', '.join(t.family)}: it may favour "
                  "its own family's answers.")
    spent = t.info.get("last_judging") or {}
    intro += f" Last judging: {spent.get('calls', 0)} judge calls, {spent.get('cache_hits', 0)} from the result cache."
    tables = []
    rows = []
    for r in t.pointwise:
        rows.append([Cell(r["deployment"], "(reference)" if r["deployment"] == view.reference else ""),
                     Cell(LABEL.get(r["category"], r["category"])),
                     Cell(_num(r["mean"]), fmt_interval(r["ci_low"], r["ci_high"]), note=str(r["method"])),
                     Cell(f"{r['unparseable']} of {r['n']}"),
                     Cell(_num(r["human_mean"]) if r["human_n"] else "not rated", f"{r['human_n']} ratings" if r["human_n"] else ""),
                     Cell(_status(t, r["category"]))])
    tables.append(Table("judge-scores", "Judge score (1–5) beside the human ratings",
                        ["deployment", "category", "judge mean", "unparseable", "human mean", "judge status"], rows,
                        "First pass, parsed answers; an unparseable answer is counted here, never scored. "
                        "Intervals resample items (none below 50)."))
    certs = []
    for c in t.certification:
        certs.append([Cell(LABEL.get(c.category, c.category)), Cell(str(c.n_items)),
                      Cell(_num(c.alpha), _interval(c.alpha_low, c.alpha_high) if math.isfinite(c.alpha) else "no parsed score rated",
                           note=c.alpha_method),
                      Cell(_num(c.raters_alpha)), Cell(f"{c.self_agree} of {c.self_n}" if c.self_n else "no output scored twice"),
                      Cell(f"{c.flips} of {c.flip_n}" if c.flip_n else "no pair judged both ways"),
                      Cell(f"{c.unparseable} of {c.judged}"),
                      Cell("certified" if c.certified else "refused: " + "; ".join(c.reasons))])
    cfg = (t.info.get("settings") or {}).get("certify") or {}
    tables.append(Table("judge-certification", "Certification against the human ratings",
                        ["category", "rated items", "alpha judge vs humans", "raters' own alpha", "same score twice",
                         "position flips", "unparseable", "verdict"], certs,
                        "Alpha: ordinal Krippendorff's alpha, each judge score against each human rating of the same output, "
                        "item-bootstrap interval. Certified when every condition holds: "
                        f"at least {cfg.get('min_items', 50)} rated items, the interval's low end at least "
                        f"{cfg.get('min_alpha', 0.667)}, alpha within {cfg.get('max_alpha_gap', 0.1)} of the raters' own, "
                        f"the same score twice for {fmt(cfg.get('min_self_agreement', 0.9), 'pct')} of outputs, at most "
                        f"{fmt(cfg.get('max_flip_rate', 0.1), 'pct')} position flips and "
                        f"{fmt(cfg.get('max_unparseable', 0.05), 'pct')} unparseable answers."))
    if t.pairwise:
        pw = [[Cell(r["deployment"]), Cell(LABEL.get(r["category"], r["category"])), Cell(str(r["pairs"])),
               Cell(str(r["wins"])), Cell(str(r["ties"])), Cell(str(r["losses"])), Cell(str(r["flips"])),
               Cell(str(r["unparseable"])), Cell(_num(r["net"]), fmt_interval(r["net_low"], r["net_high"])),
               Cell(_status(t, r["category"]))] for r in t.pairwise]
        tables.append(Table("judge-pairwise", f"Judge side by side with the reference ({view.reference}), both orders",
                            ["deployment", "category", "pairs", "wins", "ties", "losses", "position flips",
                             "unparseable", "net (win − loss)", "judge status"], pw,
                            "Each pair judged with the deployment's answer first and second; verdicts that differ "
                            "count as a tie and as a position flip."))
    ln = [[Cell(r["mode"]), Cell(LABEL.get(r["category"], r["category"])),
           Cell(_num(r["slope"], 3), _interval(r["ci_low"], r["ci_high"]) if math.isfinite(r["slope"]) else "", note=r["method"]),
           Cell(str(r["n_items"])), Cell(r["what"])] for r in t.length]
    tables.append(Table("judge-length", "Does the verdict follow answer length?",
                        ["mode", "category", "slope", "items", "what the slope is"], ln,
                        "Least-squares slope, item-bootstrap interval (none below 50 items). An interval away from 0 "
                        "means the judge's verdict moves with length; compare with the human ratings before blaming "
                        "the judge."))
    return intro, tables
