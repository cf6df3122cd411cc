"""What the judge's answers say, and whether they may be trusted: scores, bias controls, certification.

From `<run>/judge/` and the imported human ratings only (never a model):

- pointwise: the judge's mean score per deployment and category (first pass, parsed answers), beside the
  humans' mean where they rated; unparseable answers counted, never dropped silently.
- pairwise: each deployment against the reference, both orders; the two verdicts combined (they disagree: a
  tie, and a position flip counted); wins / ties / losses, net preference, flip rate.
- length: the slope of the pointwise score on the answer's length and of the pairwise outcome on the length
  difference, with item-bootstrap intervals (evalkit.metrics.judge_stats).
- family: a judge from the same model family as a judged deployment is flagged (it may favour its own).
- certification per category: Krippendorff's alpha of the judge against the raters (each judge score paired
  with each human rating of the same output) with its interval, the raters' own alpha, self-consistency (the
  second pass), the flip rate and the unparseable share, each against `judge.certify`.

Only certified categories enter the tidy tables as `judge/score` and `judge/net_preference` (comparisons with
the reference, so the decision reads them like any metric with a margin); uncertified ones are written as
`score_uncertified` / `net_preference_uncertified`, which no margin can name.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evalkit.metrics.judge_stats import alpha_by_item, slope_by_item
from evalkit.metrics.stats import StatsSettings, clustered_mean, excludes_zero, paired_mean_diff
from evalkit.store import ComparisonRow, ScoreRow, read_jsonl
from evalkit.suites.judge import NAME as SUITE  # the judge suite's name, from its spec

ALL = "all"
JUDGE_DIR, JUDGEMENTS, JUDGE_JSON = "judge", "judgements.jsonl", "judge.json"  # as evalkit.judge.run writes them
OUTCOME = {"win": 1, "tie": 0, "loss": -1}
WORDS_PER_UNIT = 10  # slopes are per 10 words of answer
CATEGORY_ORDER = ("code", "reasoning", "translation", "qa")
# Model families by name (the judge's source against each deployment's); the first match names the family.
FAMILIES = ("smollm", "gemma", "qwen", "llama", "mistral", "mixtral", "phi", "deepseek", "gpt", "claude", "olmo", "falcon")


def family_of(name: str | None) -> str | None:
    if not name:
        return None
    low = str(name).lower()
    hits = [(m.start(), f) for f in FAMILIES for m in [re.search(f, low)] if m is not None]
    return min(hits)[1] if hits else None


@dataclass(frozen=True)
class Certification:
    category: str
    n_items: int  # items with a human rating and a parsed judge score
    alpha: float
    alpha_low: float | None
    alpha_high: float | None
    alpha_method: str
    raters_alpha: float
    self_agree: int
    self_n: int
    flips: int
    flip_n: int
    unparseable: int
    judged: int
    certified: bool
    reasons: list[str] = field(default_factory=list)

    @property
    def self_agreement(self) -> float:
        return self.self_agree / self.self_n if self.self_n else math.nan

    @property
    def flip_rate(self) -> float:
        return self.flips / self.flip_n if self.flip_n else math.nan

    @property
    def unparseable_rate(self) -> float:
        return self.unparseable / self.judged if self.judged else math.nan


@dataclass
class JudgeTables:
    info: dict[str, Any]
    pointwise: list[dict[str, Any]]  # deployment, category, judge mean + interval, n, unparseable, human mean
    pairwise: list[dict[str, Any]]  # deployment, category, wins/ties/losses, flips, unparseable, net
    length: list[dict[str, Any]]  # mode, category, slope + interval, n
    certification: list[Certification]
    family: list[str]  # judged deployments of the judge's own family
    items: list[dict[str, Any]]  # one row per judge answer (viewer / items CSV): untrusted text

    def certified(self, category: str) -> bool:
        return any(c.category == category and c.certified for c in self.certification)


def _categories(recs: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    order = {c: i for i, c in enumerate(CATEGORY_ORDER)}
    cats = sorted({r["category"] for r in recs}, key=lambda c: (order.get(c, len(order)), c))
    return [(c, [r for r in recs if r["category"] == c]) for c in cats] + ([(ALL, recs)] if recs else [])


def load_judgements(run_dir: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """judge.json and the current judge's answers (first record of a key wins), or (None, []) if never judged."""
    where = Path(run_dir) / JUDGE_DIR
    if not (where / JUDGE_JSON).exists():
        return None, []
    info = json.loads((where / JUDGE_JSON).read_text(encoding="utf-8"))
    seen: dict[str, dict[str, Any]] = {}
    for r in read_jsonl(where / JUDGEMENTS) if (where / JUDGEMENTS).exists() else []:
        if r.get("identity_sha256") == info.get("identity_sha256"):
            seen.setdefault(r["key"], r)
    return info, list(seen.values())


def _human_scores(run_dir: Path) -> list[dict[str, Any]]:
    """Imported absolute ratings: (rater_id, item_id, category, deployment, score)."""
    from evalkit.rating.aggregate import ratings_frame

    frame = ratings_frame(run_dir)
    frame = frame[(frame["mode"] == "absolute") & frame["score"].notna()]
    return [{"rater": str(r.rater_id), "item_id": str(r.item_id), "category": str(r.category),
             "deployment": str(r.deployment), "score": int(r.score)} for r in frame.itertuples()]


def _pairs(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairwise answers of one (item, deployment) in both orders, combined: agreeing verdicts stand; verdicts
    that differ are a tie and a flip; an unparseable side leaves the pair without an outcome."""
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in recs:
        if r["mode"] == "pairwise":
            by.setdefault((r["item_id"], r["deployment"]), {})[r["order"]] = r
    out = []
    for (item, dep), orders in sorted(by.items()):
        ab, ba = orders.get("AB"), orders.get("BA")
        both = ab is not None and ba is not None and ab["parsed"] and ba["parsed"]
        flip = bool(both and ab["outcome"] != ba["outcome"])  # type: ignore[index]
        outcome = None if not both else ("tie" if flip else ab["outcome"])  # type: ignore[index]
        any_rec = ab or ba
        assert any_rec is not None
        out.append({"item_id": item, "deployment": dep, "category": any_rec["category"], "outcome": outcome,
                    "flip": flip, "both": both, "length_diff": any_rec["answer_words"] - any_rec.get("reference_words", 0)})
    return out


def _certify(category: str, recs: list[dict[str, Any]], humans: list[dict[str, Any]], cfg: dict[str, Any],
             st: StatsSettings) -> Certification:
    first = {(r["item_id"], r["deployment"]): r for r in recs if r["mode"] == "pointwise" and r["pass"] == 1}
    second = {(r["item_id"], r["deployment"]): r for r in recs if r["mode"] == "pointwise" and r["pass"] == 2}
    judge_units: list[tuple[str, list[int]]] = []
    by_output: dict[tuple[str, str], list[int]] = {}
    for h in humans:
        by_output.setdefault((h["item_id"], h["deployment"]), []).append(h["score"])
        j = first.get((h["item_id"], h["deployment"]))
        if j is not None and j["parsed"]:
            judge_units.append((h["item_id"], [int(j["score"]), h["score"]]))
    a = alpha_by_item(judge_units, st)
    raters = alpha_by_item([(item, scores) for (item, _), scores in by_output.items()], st)
    both = [(first[k], second[k]) for k in first if k in second and first[k]["parsed"] and second[k]["parsed"]]
    agree = sum(1 for x, y in both if x["score"] == y["score"])
    pairs = [p for p in _pairs(recs) if p["both"]]
    flips = sum(p["flip"] for p in pairs)
    bad = sum(1 for r in recs if not r["parsed"])
    c = Certification(category, a.n_items, a.alpha, a.ci_low, a.ci_high, a.method, raters.alpha, agree, len(both),
                      flips, len(pairs), bad, len(recs), False)
    reasons = []
    if c.n_items < cfg["min_items"]:
        reasons.append(f"{c.n_items} rated items judged (fewer than {cfg['min_items']})")
    if c.alpha_low is None or c.alpha_low < cfg["min_alpha"]:
        reasons.append(f"alpha vs humans {'has no interval' if c.alpha_low is None else f'low end {c.alpha_low:.2f}'} "
                       f"(needs at least {cfg['min_alpha']})")
    if math.isfinite(c.raters_alpha) and not (math.isfinite(c.alpha) and c.alpha >= c.raters_alpha - cfg["max_alpha_gap"]):
        reasons.append(f"alpha vs humans below the raters' own {c.raters_alpha:.2f} by more than {cfg['max_alpha_gap']}")
    if c.self_n and c.self_agreement < cfg["min_self_agreement"]:
        reasons.append(f"same score twice {c.self_agree}/{c.self_n} (below {cfg['min_self_agreement']:.0%})")
    if c.flip_n and c.flip_rate > cfg["max_flip_rate"]:
        reasons.append(f"position flips {c.flips}/{c.flip_n} (above {cfg['max_flip_rate']:.0%})")
    if c.judged and c.unparseable_rate > cfg["max_unparseable"]:
        reasons.append(f"unparseable {c.unparseable}/{c.judged} (above {cfg['max_unparseable']:.0%})")
    return Certification(**{**asdict(c), "certified": not reasons, "reasons": reasons})


def judge_tables(run_dir: Path, st: StatsSettings | None = None) -> JudgeTables | None:
    """Every judge table of a run (None: never judged)."""
    s = st or StatsSettings()
    info, recs = load_judgements(run_dir)
    if info is None:
        return None
    from evalkit.config import JudgeCertify

    cfg = JudgeCertify.model_validate(info.get("settings", {}).get("certify") or {}).model_dump()
    reference = str(info.get("reference"))
    humans = _human_scores(run_dir)
    pointwise, pairwise, length, certs = [], [], [], []
    for cat, c_recs in _categories(recs):
        c_humans = [h for h in humans if cat == ALL or h["category"] == cat]
        certs.append(_certify(cat, c_recs, c_humans, cfg, s))
        first = [r for r in c_recs if r["mode"] == "pointwise" and r["pass"] == 1]
        for dep in sorted({r["deployment"] for r in first}, key=lambda d: (d != reference, d)):
            mine = [r for r in first if r["deployment"] == dep]
            ok = [r for r in mine if r["parsed"]]
            hs = [h["score"] for h in c_humans if h["deployment"] == dep]
            row: dict[str, Any] = {"deployment": dep, "category": cat, "n": len(mine), "parsed": len(ok),
                                   "unparseable": len(mine) - len(ok), "mean": math.nan, "ci_low": math.nan,
                                   "ci_high": math.nan, "method": "no parsed score",
                                   "human_mean": sum(hs) / len(hs) if hs else math.nan, "human_n": len(hs)}
            if ok:
                m = clustered_mean([float(r["score"]) for r in ok], [1.0] * len(ok), s)
                row |= {"mean": m.mean, "ci_low": m.ci_low, "ci_high": m.ci_high, "method": m.method}
            pointwise.append(row)
        pairs = _pairs(c_recs)
        for dep in sorted({p["deployment"] for p in pairs}):
            mine_p = [p for p in pairs if p["deployment"] == dep]
            decided = [p for p in mine_p if p["outcome"] is not None]
            counts = {o: sum(1 for p in decided if p["outcome"] == o) for o in OUTCOME}
            row = {"deployment": dep, "reference": reference, "category": cat, "pairs": len(mine_p),
                   "wins": counts["win"], "ties": counts["tie"], "losses": counts["loss"],
                   "flips": sum(p["flip"] for p in mine_p), "unparseable": len(mine_p) - len(decided),
                   "net": math.nan, "net_low": math.nan, "net_high": math.nan, "method": "no decided pair"}
            if decided:
                m = clustered_mean([float(OUTCOME[p["outcome"]]) for p in decided], [1.0] * len(decided), s)
                row |= {"net": m.mean, "net_low": m.ci_low, "net_high": m.ci_high, "method": m.method}
            pairwise.append(row)
        pts = [(r["item_id"], r["answer_words"] / WORDS_PER_UNIT, float(r["score"])) for r in first if r["parsed"]]
        sl = slope_by_item(pts, s)
        length.append({"mode": "pointwise", "category": cat, "slope": sl.slope, "ci_low": sl.ci_low, "ci_high": sl.ci_high,
                       "n_items": sl.n_items, "n": sl.n, "method": sl.method,
                       "what": f"judge score per {WORDS_PER_UNIT} more words of answer"})
        ppts = [(p["item_id"], p["length_diff"] / WORDS_PER_UNIT, float(OUTCOME[p["outcome"]])) for p in pairs if p["outcome"]]
        sl = slope_by_item(ppts, s)
        length.append({"mode": "pairwise", "category": cat, "slope": sl.slope, "ci_low": sl.ci_low, "ci_high": sl.ci_high,
                       "n_items": sl.n_items, "n": sl.n, "method": sl.method,
                       "what": f"outcome (win 1, tie 0, loss -1) per {WORDS_PER_UNIT} words longer than the reference's"})
    identity = info.get("identity", {})
    judge_family = family_of(identity.get("model_source")) or family_of(identity.get("deployment"))
    deployments = info.get("judged_sources") or {}
    family = sorted(d for d, src in deployments.items() if judge_family and family_of(src) == judge_family)
    items = [{k: r.get(k) for k in ("item_id", "deployment", "category", "mode", "pass", "order", "score", "verdict",
                                    "outcome", "parsed", "problem", "reason", "raw")} for r in recs]
    return JudgeTables(info, pointwise, pairwise, length, certs, family, items)


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def tidy_rows(run_dir: Path, st: StatsSettings | None = None) -> tuple[list[ScoreRow], list[ComparisonRow]]:
    """The judge as suite `judge` in scores.csv / comparisons.csv (none when the run was never judged)."""
    s = st or StatsSettings()
    t = judge_tables(run_dir, s)
    if t is None:
        return [], []
    scores: list[ScoreRow] = []
    comps: list[ComparisonRow] = []
    reference = str(t.info.get("reference"))
    for r in t.pointwise:
        if r["parsed"]:
            metric = "score" if t.certified(r["category"]) else "score_uncertified"
            scores.append(ScoreRow(r["deployment"], SUITE, r["category"], metric, float(r["mean"]), _f(r["ci_low"]),
                                   _f(r["ci_high"]), int(r["parsed"])))
        scores.append(ScoreRow(r["deployment"], SUITE, r["category"], "unparseable", float(r["unparseable"]), None, None,
                               int(r["n"])))
    for r in t.pairwise:
        if r["wins"] + r["ties"] + r["losses"]:
            metric = "net_preference" if t.certified(r["category"]) else "net_preference_uncertified"
            scores.append(ScoreRow(r["deployment"], SUITE, r["category"], metric, float(r["net"]), _f(r["net_low"]),
                                   _f(r["net_high"]), r["wins"] + r["ties"] + r["losses"]))
            if t.certified(r["category"]):
                lo, hi = _f(r["net_low"]), _f(r["net_high"])
                comps.append(ComparisonRow(r["deployment"], reference, SUITE, r["category"], "net_preference", float(r["net"]),
                                           0.0, float(r["net"]), lo, hi, None, r["wins"] + r["ties"] + r["losses"],
                                           f"certified judge, both orders (a flip is a tie); {r['method']}", excludes_zero(lo, hi)))
    for c in t.certification:
        if c.flip_n:
            scores.append(ScoreRow(ALL, SUITE, c.category, "flip_rate", c.flip_rate, None, None, c.flip_n))
        if c.self_n:
            scores.append(ScoreRow(ALL, SUITE, c.category, "self_agreement", c.self_agreement, None, None, c.self_n))
        if _f(c.alpha) is not None:
            scores.append(ScoreRow(ALL, SUITE, c.category, "alpha_vs_humans", c.alpha, c.alpha_low, c.alpha_high, c.n_items))
    for r in t.length:
        if _f(r["slope"]) is not None:
            scores.append(ScoreRow(ALL, SUITE, r["category"], f"length_slope_{r['mode']}", float(r["slope"]),
                                   _f(r["ci_low"]), _f(r["ci_high"]), int(r["n_items"])))
    comps += _paired_scores(t, reference, s)
    return scores, comps


def _paired_scores(t: JudgeTables, reference: str, s: StatsSettings) -> list[ComparisonRow]:
    """Certified categories' judge scores, deployment minus reference paired by item (first pass, parsed)."""
    first = {(r["item_id"], r["deployment"]): r for r in t.items
             if r["mode"] == "pointwise" and r["pass"] == 1 and r["parsed"]}
    out = []
    deps = sorted({d for _, d in first} - {reference})
    for cat in [c.category for c in t.certification if c.certified]:
        for dep in deps:
            pairs = [(first[(i, dep)], first[(i, reference)]) for (i, d) in first
                     if d == dep and (i, reference) in first and (cat == ALL or first[(i, d)]["category"] == cat)]
            if not pairs:
                continue
            diff = paired_mean_diff([float(a["score"]) for a, _ in pairs], [float(b["score"]) for _, b in pairs], s)
            out.append(ComparisonRow(dep, reference, SUITE, cat, "score", sum(float(a["score"]) for a, _ in pairs) / len(pairs),
                                     sum(float(b["score"]) for _, b in pairs) / len(pairs), diff.diff, diff.ci_low,
                                     diff.ci_high, None, diff.n, f"certified judge, paired by item; {diff.method}",
                                     excludes_zero(diff.ci_low, diff.ci_high)))
    return out
