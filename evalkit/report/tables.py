"""The report's tables, built once from what scoring wrote; render.py prints them as HTML and Markdown.

Nothing is recomputed here: values, intervals and significance come from scores.csv, comparisons.csv,
items/<suite>.csv and the ratings aggregate. This module only picks, formats and arranges them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Literal

import pandas as pd

from evalkit.results import Run

Mark = Literal["better", "worse", "changed", "same", "na"]
MARKS: dict[str, tuple[str, str]] = {  # mark -> (symbol, legend)
    "better": ("▲", "better than the reference, distinguishable from noise (95%)"),
    "worse": ("▼", "worse than the reference, distinguishable from noise (95%)"),
    "changed": ("◆", "different from the reference, distinguishable from noise (95%)"),
    "same": ("≈", "not distinguishable from noise: the 95% interval of the difference includes 0"),
    "na": ("○", "no interval (too few items to say)"),
}
MINUS = "\u2212"
CATEGORIES = ("code", "reasoning", "translation", "qa")
CATEGORY_LABEL = {"code": "code", "reasoning": "reasoning", "translation": "translation", "qa": "QA", "all": "all"}


# -- cells and tables --------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One table cell: a value, its own interval, its difference from the reference and a mark."""

    value: str
    interval: str = ""
    diff: str = ""
    mark: Mark | None = None
    note: str = ""  # shown on hover (HTML title): method, n, p
    raw: float | None = None  # the number behind `diff` (for "how sure" lines), in display units

    @property
    def symbol(self) -> str:
        return MARKS[self.mark][0] if self.mark else ""

    def text(self) -> str:
        """One-line form for Markdown and plain text."""
        out = self.value + (f" {self.interval}" if self.interval else "")
        if self.diff:
            out += f" (Δ {self.diff}{' ' + self.symbol if self.symbol else ''})"
        elif self.symbol:
            out += f" {self.symbol}"
        return out


def plain(value: Any) -> Cell:
    return Cell(fmt(value))


@dataclass(frozen=True)
class Table:
    key: str
    title: str
    header: list[str]
    rows: list[list[Cell]]
    caption: str = ""

    @property
    def empty(self) -> bool:
        return not self.rows


# -- number formats ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """How a metric is shown: `kind` picks the format, `better` is +1 (higher is better), -1 or 0."""

    kind: str  # pct, score, rating, num, kld, ms, s, mb, count
    better: int


def metric_spec(metric: str) -> Spec:
    m = metric.lower()
    if m in ("pass@1", "contains", "exact_match", "accuracy", "recall_accuracy", "top1_agreement", "distinct_2",
             "flips_wrong_to_right", "win_rate") or m.startswith("distinct"):
        return Spec("pct", +1)
    if m in ("flip_rate", "flips_right_to_wrong", "loss_rate") or m.startswith("seq_rep"):
        return Spec("pct", -1)
    if m.startswith(("bleu", "chrf")):
        return Spec("score", +1)
    if m in ("rating", "mean"):
        return Spec("rating", +1)
    if m.startswith("kld") or m == "delta_p_rms":
        return Spec("kld", -1)
    if m in ("ppl", "bits_per_byte", "nll_mean", "ppl_ratio"):
        return Spec("num", -1)
    if "ttft" in m or "latency" in m:
        return Spec("ms", -1)
    if m.endswith("tokens_per_s"):
        return Spec("num", +1)
    if m.endswith("_s"):
        return Spec("s", -1)
    if m.endswith("_mb"):
        return Spec("mb", -1)
    return Spec("num", 0)


def isnum(x: Any) -> bool:
    return x is not None and not isinstance(x, (str, bool)) and isinstance(x, (int, float)) and math.isfinite(float(x))


def _signed(text: str) -> str:
    return text.replace("-", MINUS)


def fmt(x: Any, kind: str = "num") -> str:
    """A value in display units: pct as %, ms from seconds, 3 significant digits otherwise."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if not isnum(x):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)
    x = float(x)
    if kind == "pct":
        return _signed(f"{100 * x:.1f}%")
    if kind == "score":
        return _signed(f"{x:.1f}")
    if kind == "rating":
        return _signed(f"{x:.2f}")
    if kind == "ms":
        return _signed(f"{1000 * x:.0f} ms")
    if kind == "s":
        return _signed(f"{x:.1f} s")
    if kind == "mb":
        return f"{x / 1000:.2f} GB" if x >= 1000 else f"{x:.0f} MB"
    if kind == "count":
        return f"{x:.0f}"
    if kind == "kld":
        return _signed(f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}")
    if abs(x) >= 1000:
        return _signed(f"{x:,.0f}")
    if x == int(x) and abs(x) < 1000:
        return _signed(f"{x:.0f}")
    return _signed(f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}")


def _unit(kind: str) -> tuple[float, str, str]:
    """(scale, number format, unit suffix) for differences and intervals."""
    return {"pct": (100.0, ".1f", " pts"), "score": (1.0, ".1f", ""), "rating": (1.0, ".2f", ""),
            "ms": (1000.0, ".0f", " ms"), "s": (1.0, ".1f", " s")}.get(kind, (1.0, ".3g", ""))


def fmt_interval(lo: Any, hi: Any, kind: str = "num") -> str:
    if not (isnum(lo) and isnum(hi)):
        return ""
    scale, f, _ = _unit(kind)
    return _signed(f"[{float(lo) * scale:{f}}, {float(hi) * scale:{f}}]")


def fmt_diff(diff: Any, lo: Any, hi: Any, kind: str = "num") -> str:
    if not isnum(diff):
        return ""
    scale, f, unit = _unit(kind)
    out = _signed(f"{float(diff) * scale:+{f}}{unit}")
    ci = fmt_interval(lo, hi, kind)
    return f"{out} {ci}" if ci else f"{out} (no interval)"


def mark_for(diff: Any, lo: Any, hi: Any, significant: Any, better: int) -> Mark:
    if not (isnum(lo) and isnum(hi)):
        return "na"
    if not bool(significant):
        return "same"
    if better == 0 or not isnum(diff) or float(diff) == 0:
        return "changed"
    return "better" if float(diff) * better > 0 else "worse"


def _z(c: dict[str, Any] | pd.Series) -> float:
    """|difference| in units of its own uncertainty (half the interval / 1.96): ranks 'biggest' across metrics."""
    lo, hi, d = c.get("ci_low"), c.get("ci_high"), c.get("diff")
    if not (isnum(lo) and isnum(hi) and isnum(d)):
        return 0.0
    half = (float(hi) - float(lo)) / 2
    return abs(float(d)) / (half / 1.96) if half > 0 else math.inf


def cell(score: pd.Series | dict | None, comp: pd.Series | dict | None, spec: Spec, is_reference: bool = False) -> Cell:
    """Value and interval from a score row; difference, interval, mark and method from a comparison row."""
    src = score if score is not None else comp
    if src is None:
        return Cell("–")
    value = fmt(src.get("value"), spec.kind)
    interval = fmt_interval(score.get("ci_low"), score.get("ci_high"), spec.kind) if score is not None else ""
    if is_reference:
        return Cell(value, interval, "", None, "reference")
    if comp is None:
        return Cell(value, interval)
    diff = fmt_diff(comp.get("diff"), comp.get("ci_low"), comp.get("ci_high"), spec.kind)
    mark = mark_for(comp.get("diff"), comp.get("ci_low"), comp.get("ci_high"), comp.get("significant"), spec.better)
    p = comp.get("p_value")
    note = "; ".join(x for x in (str(comp.get("method") or ""), f"n = {fmt(comp.get('n'), 'count')}",
                                 f"p = {float(p):.3g}" if isnum(p) else "") if x)
    return Cell(value, interval, diff, mark, note, _z(comp))


# -- the run, as the report reads it -----------------------------------------------------------


class RunView:
    """Lookups over a Run's frames; every method returns None / empty when the data are absent."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.reference = run.reference
        self.deployments = run.deployments
        self.scores = run.scores
        self.comps = run.comparisons

    def has(self, suite: str) -> bool:
        return (not self.scores.empty and bool((self.scores.suite == suite).any())) or not self.items(suite).empty

    def score(self, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
        return _row(self.scores, dep, suite, category, metric)

    def comp(self, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
        return _row(self.comps, dep, suite, category, metric) if dep != self.reference else None

    def cell(self, dep: str, suite: str, category: str, metric: str, comp_metric: str | None = None) -> Cell:
        spec = metric_spec(metric)
        return cell(self.score(dep, suite, category, metric), self.comp(dep, suite, category, comp_metric or metric),
                    spec, dep == self.reference)

    def suite_scores(self, suite: str) -> pd.DataFrame:
        return self.scores[self.scores.suite == suite] if not self.scores.empty else self.scores

    def suite_comps(self, suite: str) -> pd.DataFrame:
        return self.comps[self.comps.suite == suite] if not self.comps.empty else self.comps

    def items(self, suite: str) -> pd.DataFrame:
        """items/<suite>.csv (Run.items concatenates suites without saying which row came from which)."""
        path = self.run.path / "items" / f"{suite}.csv"
        if not path.exists() or path.stat().st_size == 0:
            return pd.DataFrame()
        return pd.read_csv(path, encoding="utf-8-sig")

    def records(self, suite: str) -> dict[str, list[dict[str, Any]]]:
        """Raw records of one suite per deployment (model output unescaped: render escapes it)."""
        return {d: [r for r in self.run.run_dir.records(d) if r.get("suite") == suite] for d in self.deployments}

    @cached_property
    def human(self) -> dict[str, pd.DataFrame]:
        """aggregate() tables when ratings were imported, else {}."""
        if self.run.ratings.empty:
            return {}
        from evalkit.rating.aggregate import aggregate

        return aggregate(self.run.path)

    @cached_property
    def suite_info(self) -> dict[str, dict[str, Any]]:
        """Each suite's describe(): from the manifest when the pipeline stored it, else asked now."""
        stored = self.run.manifest.get("suites")
        if isinstance(stored, dict):
            return stored
        return describe_suites(self.run)

    @cached_property
    def mmlu_label(self) -> str:
        """evalkit's built-in set must not be called MMLU (evalkit.suites.mmlu.BUILTIN_LABEL)."""
        label = self.suite_info.get("mmlu", {}).get("dataset")
        if label:
            return "MMLU" if label == "MMLU" else "MC"
        source = ((self.run.manifest.get("config") or {}).get("suites") or {}).get("mmlu", {}) or {}
        return "MC" if source.get("source") == "builtin" else "MMLU"


def _row(df: pd.DataFrame, dep: str, suite: str, category: str, metric: str) -> pd.Series | None:
    if df.empty:
        return None
    m = df[(df.deployment == dep) & (df.suite == suite) & (df.category.astype(str) == category) & (df.metric == metric)]
    return None if m.empty else m.iloc[0]


def describe_suites(run: Run) -> dict[str, dict[str, Any]]:
    """describe() of every enabled suite, each guarded: provenance must never stop a report.

    Suites whose data would be fetched from the network (MMLU from the hub) are not asked.
    """
    from evalkit.config import Config
    from evalkit.suites import enabled_suites

    out: dict[str, dict[str, Any]] = {}
    try:
        config = Config.model_validate(run.manifest["config"])
        suites = enabled_suites(config, Path(run.manifest["config_file"]))
    except Exception as e:  # an old or hand-edited manifest: say so instead of failing the report
        return {"*": {"error": f"{type(e).__name__}: {e}"}}
    for suite in suites:
        if suite.name == "mmlu" and getattr(suite.settings, "source", "") == "hf":
            out[suite.name] = {"source": "hf", "note": "not described offline (data on the hub)"}
            continue
        try:
            out[suite.name] = suite.describe()
        except Exception as e:
            out[suite.name] = {"error": f"{type(e).__name__}: {e}"}
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


# -- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    label: str
    get: Callable[[str], Cell]  # deployment -> cell


def _translation_langs(view: RunView, prefix: str) -> list[str]:
    s = view.suite_scores("prompts")
    if s.empty:
        return []
    return sorted({str(m)[len(prefix):] for m in s.metric if str(m).startswith(prefix)})


def _human_cell(view: RunView, dep: str, category: str) -> Cell:
    absolute = view.human.get("absolute", pd.DataFrame())
    versus = view.human.get("absolute_vs_reference", pd.DataFrame())
    a = absolute[(absolute.deployment == dep) & (absolute.category == category)] if not absolute.empty else absolute
    if a.empty:
        return Cell("–")
    row = a.iloc[0]
    score = {"value": row["mean"], "ci_low": row["ci_low"], "ci_high": row["ci_high"]}
    v = versus[(versus.deployment == dep) & (versus.category == category)] if not versus.empty else versus
    comp = None
    if not v.empty:
        r = v.iloc[0]
        comp = {"diff": r["diff"], "ci_low": r["ci_low"], "ci_high": r["ci_high"], "significant": r["significant"],
                "method": f"{r['method']}; {int(row['n_raters'])} raters", "n": r["n_items"]}
    return cell(score, comp, Spec("rating", +1), dep == view.reference)


def _flips_cell(view: RunView, dep: str, suite: str = "mmlu", category: str = "all") -> Cell:
    if dep == view.reference:
        return Cell("–", note="reference")
    rate = view.comp(dep, suite, category, "flip_rate")
    if rate is None:
        return Cell("–")
    n = int(rate["n"])
    r2w = view.comp(dep, suite, category, "flips_right_to_wrong")
    w2r = view.comp(dep, suite, category, "flips_wrong_to_right")
    k_r2w = round(float(r2w["value"]) * n) if r2w is not None else 0
    k_w2r = round(float(w2r["value"]) * n) if w2r is not None else 0
    mark: Mark = "same"
    if bool(rate["significant"]):
        mark = "worse" if k_r2w > k_w2r else "better"
    p = rate.get("p_value")
    return Cell(f"{k_r2w + k_w2r} of {n}", fmt_interval(rate["ci_low"], rate["ci_high"], "pct"),
                f"{k_r2w} ✓→✗, {k_w2r} ✗→✓", mark,
                f"flipped answers vs the reference; p = {float(p):.3g} (McNemar exact: are the flips one-sided?)"
                if isnum(p) else "", _z(rate) if mark != "same" else 0.0)


def _kld_cell(view: RunView, dep: str) -> Cell:
    if dep == view.reference:
        return Cell("–", note="reference")
    score = view.score(dep, "perplexity", "text", "kld_mean")
    comp = view.comp(dep, "perplexity", "text", "kld")
    if comp is not None and not isnum(comp.get("value")):  # not computed (e.g. tokenizations differ)
        return Cell("–", note=str(comp.get("method")))
    c = cell(score, comp, Spec("kld", -1))
    return Cell(c.value, c.interval, "", c.mark, c.note, c.raw)  # the value is the difference: shown once


def _longest_length(view: RunView, metric: str) -> str | None:
    """The longest context length at which every deployment has `metric` (so the column compares like with like)."""
    s = view.suite_scores("longcontext")
    if s.empty:
        return None
    s = s[(s.metric == metric) & s.category.astype(str).str.match(r"^L\d+$")]
    common = None
    for dep in view.deployments:
        cats = set(s[s.deployment == dep].category.astype(str))
        common = cats if common is None else common & cats
    return max(common, key=lambda c: int(c[1:])) if common else None


def verdict_columns(view: RunView) -> list[Column]:
    cols: list[Column] = []
    human = not view.human.get("absolute", pd.DataFrame()).empty
    if view.has("prompts") or human:
        for cat in CATEGORIES:
            if human:
                cols.append(Column(f"{CATEGORY_LABEL[cat]} (rating 1–5)", lambda d, c=cat: _human_cell(view, d, c)))
            elif cat == "code":
                cols.append(Column("code pass@1", lambda d: view.cell(d, "prompts", "code", "pass@1")))
            elif cat == "translation":
                for lang in _translation_langs(view, "chrf_en-"):
                    cols.append(Column(f"translation chrF en-{lang}",
                                       lambda d, m=f"chrf_en-{lang}": view.cell(d, "prompts", "translation", m)))
            else:
                cols.append(Column(f"{CATEGORY_LABEL[cat]} correct",
                                   lambda d, c=cat: view.cell(d, "prompts", c, "contains")))
        for lang in _translation_langs(view, "bleu_en-"):
            cols.append(Column(f"BLEU en-{lang}", lambda d, m=f"bleu_en-{lang}": view.cell(d, "prompts", "translation", m)))
    if view.has("perplexity"):
        cols.append(Column("PPL", lambda d: view.cell(d, "perplexity", "text", "ppl")))
        cols.append(Column("KLD", lambda d: _kld_cell(view, d)))
    if view.has("mmlu"):
        cols.append(Column(view.mmlu_label, lambda d: view.cell(d, "mmlu", "all", "accuracy")))
        cols.append(Column(f"{view.mmlu_label} flips", lambda d: _flips_cell(view, d)))
    if view.has("humaneval"):
        cols.append(Column("HumanEval pass@1", lambda d: view.cell(d, "humaneval", "code", "pass@1")))
    length = _longest_length(view, "seq_rep_4")
    if length:
        cols.append(Column(f"repetition @{_k(length)}", lambda d: view.cell(d, "longcontext", length, "seq_rep_4")))
    if view.score(view.reference, "longcontext", "all", "recall_accuracy") is not None:
        cols.append(Column("pass-key recall", lambda d: view.cell(d, "longcontext", "all", "recall_accuracy")))
    return cols


def _k(category: str) -> str:
    n = int(category[1:])
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def verdict(view: RunView) -> Table:
    cols = verdict_columns(view)
    rows = []
    for dep in view.deployments:
        name = Cell(dep, "reference" if dep == view.reference else "")
        rows.append([name] + [c.get(dep) for c in cols])
    human = any("rating" in c.label for c in cols)
    caption = ("Category columns are mean human ratings (1–5) with item-bootstrap intervals. " if human else
               "Category columns are automatic scores (tests passed, answer found, chrF). ") + (
        "Each cell: the value and its 95% interval; below it, the difference from the reference with its 95% interval.")
    return Table("verdict", "Verdict", ["deployment"] + [c.label for c in cols], rows, caption)


@dataclass(frozen=True)
class Sureness:
    deployment: str
    text: str
    significant: int
    tested: int


def how_sure(view: RunView, table: Table) -> list[Sureness]:
    """One plain sentence per deployment: how many differences are beyond noise, and the biggest of them."""
    out = []
    for row in table.rows:
        dep = row[0].value
        if dep == view.reference:
            continue
        named = list(zip(table.header[1:], row[1:]))
        tested = [(h, c) for h, c in named if c.mark in ("better", "worse", "changed", "same")]
        sig = sorted(((h, c) for h, c in tested if c.mark != "same"), key=lambda hc: -(hc[1].raw or 0))
        no_ci = sum(c.mark == "na" for _, c in named)
        if not tested:
            text = "no difference has an interval yet (too few items)."
        elif not sig:
            text = f"none of {len(tested)} differences is distinguishable from noise at this sample size."
        else:
            parts = [f"{h} {c.diff or (c.value + ' ' + c.interval).strip()}" for h, c in sig[:3]]
            text = (f"{len(sig)} of {len(tested)} differences {'is' if len(sig) == 1 else 'are'} distinguishable "
                    f"from noise; biggest: {parts[0]}" + (f"; then {'; '.join(parts[1:])}" if len(parts) > 1 else "") + ".")
        if no_ci:
            text += f" {no_ci} more {'has' if no_ci == 1 else 'have'} no interval."
        out.append(Sureness(dep, text, len(sig), len(tested)))
    return out


# -- suite tables ------------------------------------------------------------------------------


def metric_table(view: RunView, key: str, title: str, columns: list[tuple[str, str, str, str]], caption: str = "") -> Table:
    """Rows = deployments; columns = (label, suite, category, metric); cells with difference and mark."""
    present = [c for c in columns if any(view.score(d, *c[1:]) is not None for d in view.deployments)]
    rows = [[Cell(d, "reference" if d == view.reference else "")] + [view.cell(d, *c[1:]) for c in present]
            for d in view.deployments]
    return Table(key, title, ["deployment"] + [c[0] for c in present], rows if present else [], caption)


def prompts_table(view: RunView) -> Table:
    cols = [("code pass@1", "prompts", "code", "pass@1"),
            ("reasoning correct", "prompts", "reasoning", "contains"),
            ("reasoning exact", "prompts", "reasoning", "exact_match"),
            ("QA correct", "prompts", "qa", "contains"),
            ("QA exact", "prompts", "qa", "exact_match")]
    for lang in _translation_langs(view, "bleu_en-"):
        cols += [(f"BLEU en-{lang}", "prompts", "translation", f"bleu_en-{lang}"),
                 (f"chrF en-{lang}", "prompts", "translation", f"chrf_en-{lang}")]
    cols.append(("output tokens (mean)", "prompts", "all", "output_tokens_mean"))
    return metric_table(view, "prompts-scores", "Automatic scores by category", cols,
                        "“correct”: the gold answer appears in the output; “exact”: the output is the answer. "
                        "Code runs its tests in the sandbox.")


def perplexity_table(view: RunView) -> Table:
    cols = [("PPL", "ppl"), ("bits/byte", "bits_per_byte"), ("KLD mean", "kld_mean"), ("KLD median", "kld_median"),
            ("KLD p90", "kld_p90"), ("KLD p99", "kld_p99"), ("KLD max", "kld_max"),
            ("top-1 agreement", "top1_agreement"), ("Δp RMS", "delta_p_rms"), ("tokens", "n_tokens")]
    return metric_table(view, "perplexity-scores", "Perplexity and drift from the reference",
                        [(label, "perplexity", "text", m) for label, m in cols],
                        "KLD is KL(reference ‖ deployment) per token from stored top-k log-probabilities plus one "
                        "tail bucket (a lower bound). PPL ± is llama-perplexity's (tokens as independent draws).")


def mmlu_subject_table(view: RunView) -> Table:
    """Rows = subjects (then all); one column per deployment: accuracy [CI] and its difference."""
    s = view.suite_scores("mmlu")
    if s.empty:
        return Table("mmlu-subjects", "", [], [])
    subjects = sorted({str(c) for c in s[s.metric == "accuracy"].category if str(c) != "all"}) + ["all"]
    rows = [[Cell(sub.replace("_", " "))] + [view.cell(d, "mmlu", sub, "accuracy") for d in view.deployments]
            for sub in subjects]
    return Table("mmlu-subjects", f"{view.mmlu_label} accuracy by subject", ["subject"] + list(view.deployments), rows,
                 "Accuracy with Wilson 95% intervals; differences: paired bootstrap interval, McNemar exact test.")


def flips_table(view: RunView, suite: str, category: str, unit: str) -> Table:
    rows = []
    for dep in view.deployments:
        if dep == view.reference:
            continue
        rate = view.comp(dep, suite, category, "flip_rate")
        if rate is None:
            continue
        n = int(rate["n"])
        k = {m: round(float(r["value"]) * n) if (r := view.comp(dep, suite, category, m)) is not None else 0
             for m in ("flips_right_to_wrong", "flips_wrong_to_right")}
        rows.append([Cell(dep), plain(n), Cell(fmt(rate["value"], "pct"), fmt_interval(rate["ci_low"], rate["ci_high"], "pct")),
                     plain(k["flips_right_to_wrong"]), plain(k["flips_wrong_to_right"]),
                     Cell(f"{float(rate['p_value']):.3g}" if isnum(rate.get("p_value")) else "–")])
    return Table(f"{suite}-flips", f"Answers that changed against the reference ({unit})",
                 ["deployment", unit, "flipped", "✓→✗ (reference right)", "✗→✓ (reference wrong)", "McNemar p"], rows,
                 "A small p means the flips go mostly one way: a real change, not noise.")


def flipped_items(view: RunView, suite: str = "mmlu", limit: int = 40) -> Table:
    items = view.items(suite)
    if items.empty or "flip" not in items:
        return Table(f"{suite}-flipped", "", [], [])
    f = items[items.flip.fillna("").astype(str) != ""]
    cols = [c for c in ("item_id", "deployment", "flip", "reference_pred", "output", "gold", "status") if c in f]
    rows = [[plain(r[c]) for c in cols] for _, r in f.head(limit).iterrows()]
    more = f" (first {limit} of {len(f)})" if len(f) > limit else ""
    return Table(f"{suite}-flipped", f"Flipped items{more}", cols, rows)


def longcontext_tables(view: RunView) -> list[Table]:
    s = view.suite_scores("longcontext")
    if s.empty:
        return []
    lengths = sorted({str(c) for c in s.category if str(c).startswith("L")}, key=lambda c: int(c[1:]))
    out = []
    for metric, title in (("seq_rep_4", "Repetition (seq-rep-4) by context length"),
                          ("distinct_2", "Distinct bigrams (distinct-2) by context length"),
                          ("recall_accuracy", "Pass-key recall by context length")):
        cols = [(f"{c[1:]} tokens", "longcontext", c, metric) for c in lengths]
        if metric == "recall_accuracy":
            cols.append(("all lengths", "longcontext", "all", metric))
        t = metric_table(view, f"longcontext-{metric}", title, cols)
        if not t.empty:
            out.append(t)
    skipped = s[s.metric == "skipped_items"]
    if not skipped.empty:
        rows = [[Cell(r.deployment), Cell(f"{str(r.category)[1:]} tokens"), plain(int(r.value))] for r in skipped.itertuples()]
        out.append(Table("longcontext-skipped", "Lengths not run", ["deployment", "length", "items skipped"], rows,
                         "The prompt plus the tokens to generate did not fit the engine's context (n_ctx)."))
    return out


def humaneval_table(view: RunView) -> Table:
    return metric_table(view, "humaneval-scores", "HumanEval pass@1", [("pass@1", "humaneval", "code", "pass@1")],
                        "Plain completion of each task prompt, run against its tests in the sandbox.")


# -- cost and memory -----------------------------------------------------------------------------


def _levels(view: RunView) -> list[str]:
    s = view.suite_scores("cost")
    return sorted({str(c) for c in s.category if str(c).startswith("c")}, key=lambda c: int(c[1:])) if not s.empty else []


def cost_tables(view: RunView) -> list[Table]:
    levels = _levels(view)
    if not levels:
        return []
    out = []
    for metric, title, kind in (
        ("per_request_tokens_per_s", "Output tokens/s per request, by concurrent requests", "num"),
        ("tokens_per_s", "Output tokens/s, all requests together, by concurrent requests", "num"),
        ("ttft_median_s", "Time to first token (median), by concurrent requests", "ms"),
        ("latency_p90_s", "Request latency (p90), by concurrent requests", "s"),
    ):
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
        peak = _measured_peak(view, dep)
        if start is not None or peak:
            rows.append([Cell(dep), Cell(fmt(start["value"], "s") if start is not None else "–"),
                         Cell(fmt(peak[0], "mb") + f" ({peak[1]})" if peak else "–")])
    if rows:
        out.append(Table("cost-startup", "Start-up and peak memory", ["deployment", "model load", "peak memory"], rows))
    return out


def _measured_peak(view: RunView, dep: str) -> tuple[float, str] | None:
    """Highest memory the cost suite saw: per GPU when GPUs were sampled, else the process tree's RSS (MB)."""
    s = view.suite_scores("cost")
    if s.empty:
        return None
    mine = s[s.deployment == dep]
    for metric, where in (("peak_gpu_mem_mb", "busiest GPU"), ("peak_rss_mb", "RAM, process tree")):
        v = mine[mine.metric == metric].value
        if not v.empty:
            return float(v.max()), where
    return None


def ledger_table(view: RunView) -> Table:
    """The memory ledger's prediction beside the cost suite's measured peak (when both exist)."""
    ledger = view.run.manifest.get("ledger") or []
    rows = []
    gb = 1e9
    for r in ledger:
        peak = _measured_peak(view, r["deployment"])
        predicted = r.get("per_device_bytes")
        ratio = f"{peak[0] * 1e6 / predicted:.2f}" if peak and predicted else "–"
        rows.append([Cell(r["deployment"]), Cell(str(r.get("precision", "–"))), Cell(str(r.get("devices", "–"))),
                     Cell(fmt((r.get("weights_bytes") or 0) / gb) + " GB"), Cell(fmt((r.get("kv_bytes") or 0) / gb) + " GB"),
                     Cell(fmt((predicted or 0) / gb) + " GB"), Cell({True: "yes", False: "NO", None: "?"}[r.get("fits")]),
                     Cell(fmt(peak[0] / 1000) + f" GB ({peak[1]})" if peak else "not measured"), Cell(ratio),
                     Cell(str(r.get("notes", "")))])
    return Table("ledger", "Memory ledger: predicted before loading vs measured", [
        "deployment", "precision", "devices", "weights", "KV cache", "predicted per device", "fits", "measured peak",
        "measured / predicted", "notes"], rows,
        "GB = 10⁹ bytes. vLLM reserves its share of the GPU up front, so its measured peak tracks the reservation.")


# -- human ratings -----------------------------------------------------------------------------


def human_tables(view: RunView) -> list[Table]:
    h = view.human
    if not h:
        return []
    out = []
    absolute = h.get("absolute", pd.DataFrame())
    if not absolute.empty:
        cats = [c for c in list(CATEGORIES) + ["all"] if c in set(absolute.category)]
        rows = [[Cell(d, "reference" if d == view.reference else "")] + [_human_cell(view, d, c) for c in cats]
                for d in view.deployments if d in set(absolute.deployment)]
        out.append(Table("human-absolute", "Mean rating (1–5) by category", ["deployment"] + [CATEGORY_LABEL[c] for c in cats],
                         rows, "Intervals resample whole items (two raters on one output are not two observations)."))
    pw = h.get("pairwise", pd.DataFrame())
    if not pw.empty:
        rows = []
        for r in pw.itertuples():
            net = cell({"value": r.net, "ci_low": r.net_low, "ci_high": r.net_high}, None, Spec("num", +1))
            rows.append([Cell(r.deployment), Cell(CATEGORY_LABEL.get(r.category, r.category)), plain(r.n_ratings),
                         Cell(fmt(r.win_rate, "pct"), fmt_interval(r.win_low, r.win_high, "pct")),
                         Cell(fmt(r.tie_rate, "pct"), fmt_interval(r.tie_low, r.tie_high, "pct")),
                         Cell(fmt(r.loss_rate, "pct"), fmt_interval(r.loss_low, r.loss_high, "pct")),
                         Cell(_signed(f"{r.net:+.2f}"), net.interval)])
        out.append(Table("human-pairwise", f"Side by side with the reference ({view.reference})",
                         ["deployment", "category", "ratings", "win", "tie", "loss", "net (win − loss)"], rows,
                         "Win/tie/loss: Wilson intervals per rating; net: item bootstrap."))
    ag = h.get("agreement", pd.DataFrame())
    if not ag.empty:
        rows = [[Cell(r.mode), Cell(CATEGORY_LABEL.get(r.category, r.category)),
                 Cell(fmt(r.alpha) if isnum(r.alpha) else "undefined"), plain(r.n_raters), plain(r.n_items),
                 plain(r.n_pairable_units)] for r in ag.itertuples()]
        out.append(Table("human-agreement", "Agreement between raters (Krippendorff's alpha, ordinal)",
                         ["mode", "category", "alpha", "raters", "items", "outputs rated twice+"], rows,
                         "1 = perfect agreement, 0 = chance; below ~0.67 conclusions from the ratings are tentative."))
    return out


# -- what ran where --------------------------------------------------------------------------


def hardware_table(view: RunView) -> Table:
    rows = []
    for name in view.deployments:
        dep = view.run.manifest["deployments"][name]
        hw = dep.get("hardware") or {}
        notes = "; ".join([hw.get("explanation") or ""] + list(hw.get("notes") or []))
        rows.append([Cell(name), Cell(dep.get("engine", "–")), Cell(str(dep.get("source", "–"))),
                     Cell(str(dep.get("variant") or "–")), Cell(str(hw.get("requested_quantization") or "none")),
                     Cell(str(hw.get("effective_precision", "–"))), Cell(str(hw.get("device", "–"))), Cell(notes.strip("; "))])
    return Table("hardware", "What the hardware really ran", ["deployment", "engine", "model", "variant", "requested",
                                                               "effective precision", "device", "explanation"], rows)


def warnings(view: RunView) -> list[tuple[str, str]]:
    out = []
    for name in view.deployments:
        w = ((view.run.manifest["deployments"].get(name) or {}).get("hardware") or {}).get("warning")
        if w:
            out.append((name, str(w)))
    return out


def parity_tables(view: RunView) -> list[Table]:
    path = view.run.path / "parity.csv"
    if not path.exists() or path.stat().st_size == 0:
        return []
    p = pd.read_csv(path, encoding="utf-8-sig")
    if p.empty:
        return []
    summary = p[p.item_id.astype(str) == "*"]
    out = [Table("parity", "Token parity: same prompt tokens as the reference's deployment of the same model",
                 ["suite", "deployment", "reference", "identical"],
                 [[Cell(r.suite), Cell(r.deployment), Cell(r.reference), Cell(str(r.status))] for r in summary.itertuples()],
                 "Only deployments of the same source model are compared; a mismatch (template, BOS, tokenizer) "
                 "makes likelihood comparisons of that item invalid.")]
    mism = p[p.status.astype(str) == "mismatch"]
    if not mism.empty:
        cols = ["suite", "item_id", "deployment", "first_difference_at", "deployment_tokens", "reference_tokens",
                "deployment_len", "reference_len"]
        out.append(Table("parity-mismatch", f"Items whose prompt tokens differ ({len(mism)})", cols,
                         [[plain(r[c]) for c in cols] for _, r in mism.head(40).iterrows()]))
    return out


def engines_table(view: RunView) -> Table:
    e = view.run.engines
    rows = []
    if not e.empty:
        for r in e.to_dict("records"):
            template = r.get("chat_template")
            rows.append([Cell(str(r.get("deployment"))), Cell(f"{r.get('engine')} {r.get('engine_version')}"),
                         Cell(str(template) if template else "none (plain completion)"),
                         Cell("yes" if r.get("add_bos") else "no"), Cell(fmt(r.get("bos_token_id"))),
                         Cell(fmt(r.get("n_ctx"), "count")), Cell(fmt(r.get("load_s"), "s"))])
    return Table("engines", "Engines", ["deployment", "engine", "chat template", "BOS added", "BOS id", "n_ctx",
                                        "load time"], rows)


def environment_table(view: RunView) -> Table:
    m = view.run.manifest
    env = m.get("environment") or {}
    rows = [[Cell("evalkit"), Cell(str(m.get("evalkit_version", "–")))]]
    for k, v in (env.get("machine") or {}).items():
        rows.append([Cell(k), Cell(f"{v / 1e9:.1f} GB" if k == "ram_bytes" and isnum(v) else str(v))])
    for a in env.get("accelerators") or []:
        cap = a.get("capability")
        rows.append([Cell(f"accelerator {a.get('index')}"),
                     Cell(f"{a.get('name')}" + (f", capability {cap[0]}.{cap[1]}" if cap else "")
                          + (f", {a['memory_bytes'] / 2**30:.0f} GiB" if isnum(a.get("memory_bytes")) else ""))])
    libs = ", ".join(f"{k} {v}" for k, v in (env.get("libraries") or {}).items() if v)
    rows.append([Cell("libraries"), Cell(libs)])
    sampling = (m.get("config") or {}).get("sampling") or {}
    rows.append([Cell("sampling"), Cell(", ".join(f"{k} {v}" for k, v in sampling.items()))])
    rows.append([Cell("config"), Cell(str(m.get("config_file", "–")))])
    return Table("environment", "Environment", ["", ""], rows)


def signatures_table(view: RunView) -> Table:
    rows = []
    for lang, sigs in bleu_signatures(view).items():
        for name, sig in sigs.items():
            rows.append([Cell(f"prompts · {name} en-{lang}"), Cell(str(sig))])
    for suite, info in view.suite_info.items():
        for k, v in _flatten(info):
            if k.startswith("bleu_signatures"):
                continue
            rows.append([Cell(f"{suite} · {k}"), Cell(v)])
    return Table("signatures", "Signatures and provenance", ["what", "value"], rows,
                 "Everything needed to reproduce a number: metric signatures, data files and their hashes, methods.")


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict):
        out = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(d, list):
        text = ", ".join(map(str, d))
        return [(prefix, text if len(text) <= 300 else text[:300] + f"… ({len(d)} entries)")]
    return [(prefix, str(d))]


def all_numbers(view: RunView) -> list[Table]:
    """scores.csv and comparisons.csv in full, for tracing any number in the report."""
    out = []
    if not view.comps.empty:
        cols = ["deployment", "suite", "category", "metric", "value", "reference_value", "diff", "ci_low", "ci_high",
                "p_value", "n", "method", "significant"]
        out.append(Table("all-comparisons", "Every paired comparison (comparisons.csv)", cols,
                         [[plain(r[c]) for c in cols] for _, r in view.comps.iterrows()]))
    if not view.scores.empty:
        cols = ["deployment", "suite", "category", "metric", "value", "ci_low", "ci_high", "n"]
        out.append(Table("all-scores", "Every score (scores.csv)", cols,
                         [[plain(r[c]) for c in cols] for _, r in view.scores.iterrows()]))
    return out


@dataclass
class Example:
    """One item with every deployment's output side by side (model text: escaped on rendering)."""

    title: str
    prompt: str
    outputs: list[tuple[str, str, str]] = field(default_factory=list)  # (deployment, verdict, text)
