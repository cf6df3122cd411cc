"""`evalkit diff BASELINE NEW`: did anything get worse between two runs, is it real, and what changed?

For every deployment present in both runs (the same name, or pairs given) and every suite both ran, the two
results' comparability keys (evalkit.history) say what changed between the runs. Where the suite's items are
the same (no `items` field differs), the records of the items both runs have go to the suite's own
`compare()` — and `score()` where a margin needs a value that only exists against a reference, such as the
perplexity ratio — with the baseline side as the reference: the statistics of comparisons.csv
(evalkit.metrics.stats through metrics.compare: McNemar flips and the paired pass/fail interval, paired
bootstrap, corpus bootstrap), under the newer run's `stats:`. Each margin (the newer run's
`decision.margins`, then `--margin KEY=VALUE`) is judged on that paired interval exactly as the decision
judges a deployment against the reference (evalkit.decision.judge_margin): non-inferior, inferior,
inconclusive.

Exit codes (evalkit's): 0 no margin crossed; 1 a regression: some margin `inferior` (or, with
`--fail-on inconclusive`, not shown non-inferior); 2 bad input, or nothing comparable between the runs.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evalkit.errors import ConfigError, EvalkitError, RunDirError
from evalkit.fileio import json_safe
from evalkit.history import blocking, describe_change, history_entries, key_changes, result_keys, unpaired_metrics
from evalkit.store import COMPARISON_COLUMNS, RunDir

EXIT_OK, EXIT_REGRESSION = 0, 1
# Fields of a record that hold what the engine produced (timings, cache flags and reference-dependent figures
# such as the KLD are not): two records with equal outcome fields are the same result.
OUTCOME_FIELDS = ("output_token_ids", "choice_logprobs", "pred", "nll_sum", "n_scored", "tokens_sha256", "correct",
                  "skipped", "passkey")


def _counts_outputs(suite: str) -> bool:
    """Whether changed outputs of `suite` are counted: not for a suite whose metrics are limits of a workload
    (SuiteSpec.quality False: measurements of speed, never the same twice), compared but not counted as outputs."""
    from evalkit.suites import suite_spec

    try:
        return bool(suite_spec(suite).quality)
    except Exception:  # a suite this evalkit does not know: count, as for any other
        return True


class NothingComparable(EvalkitError):
    """The two runs share no (deployment, suite) whose items are the same."""


@dataclass
class SuiteDiff:
    suite: str
    changes: list[dict[str, Any]]
    comparable: bool
    reason: str = ""
    shared_items: int = 0
    baseline_items: int = 0
    new_items: int = 0
    outputs_changed: int | None = None  # shared items whose outcome fields differ (None: not counted)
    rows: list[dict[str, Any]] = field(default_factory=list)  # ComparisonRow fields + shared_items
    error: str = ""
    not_compared: list[str] = field(default_factory=list)  # metrics a changed setting of the suite can change


@dataclass
class PairDiff:
    deployment: str  # in the new run
    baseline_deployment: str
    suites: list[SuiteDiff]
    margins: list[dict[str, Any]] = field(default_factory=list)  # evalkit.decision.MarginResult fields + suite
    unjudged: list[str] = field(default_factory=list)  # margins whose suite was not compared for this pair

    @property
    def changes(self) -> list[dict[str, Any]]:
        """The key fields that differ in any compared suite (each field once)."""
        seen: dict[str, dict[str, Any]] = {}
        for s in self.suites:
            for c in s.changes:
                seen.setdefault(c["field"], c)
        return list(seen.values())

    def cause(self) -> str:
        from evalkit.history import summarize_changes

        return summarize_changes([c for c in self.changes if c["kind"] != "items"])


@dataclass
class DiffResult:
    baseline: str
    new: str
    baseline_path: str
    new_path: str
    pairs: list[PairDiff]
    fail_on: str
    notes: list[str] = field(default_factory=list)

    def regressions(self) -> list[dict[str, Any]]:
        bad = {"inferior"} | ({"inconclusive"} if self.fail_on == "inconclusive" else set())
        return [{"deployment": p.deployment, **m} for p in self.pairs for m in p.margins if m["decision"] in bad]

    @property
    def exit_code(self) -> int:
        return EXIT_REGRESSION if self.regressions() else EXIT_OK

    def rows(self) -> list[dict[str, Any]]:
        """Every comparison row, flat (the CSV): pair, suite, what changed, the statistics, margin and verdict."""
        out = []
        for p in self.pairs:
            verdicts = {(m["suite"], m["category"], m["metric"]): m for m in p.margins}
            for s in p.suites:
                changed = "; ".join(describe_change(c, 64) for c in s.changes)
                if not s.rows:
                    out.append({"baseline_run": self.baseline, "new_run": self.new, "deployment": p.deployment,
                                "baseline_deployment": p.baseline_deployment, "suite": s.suite, "comparable": s.comparable,
                                "changed": changed, "note": s.reason or s.error})
                for r in s.rows:
                    m = verdicts.get((r["suite"], r["category"], r["metric"]))
                    out.append({"baseline_run": self.baseline, "new_run": self.new, "deployment": p.deployment,
                                "baseline_deployment": p.baseline_deployment, "suite": s.suite, "comparable": True,
                                "changed": changed, "outputs_changed": s.outputs_changed,
                                **{k: r.get(k) for k in COMPARISON_COLUMNS if k not in ("deployment", "reference", "suite", "margin", "decision")},
                                "shared_items": r.get("shared_items"),
                                "margin": m["margin"] if m else None, "verdict": m["decision"] if m else None, "note": ""})
            for m in p.margins:
                if m.get("from_scores"):  # a margin on a value only score() gives (ppl_ratio): its own row
                    out.append({"baseline_run": self.baseline, "new_run": self.new, "deployment": p.deployment,
                                "baseline_deployment": p.baseline_deployment, "suite": m["suite"], "comparable": True,
                                "category": m["category"], "metric": m["metric"], "value": m["estimate"],
                                "ci_low": m["ci_low"], "ci_high": m["ci_high"], "n": m["n"], "margin": m["margin"],
                                "verdict": m["decision"], "note": f"tested quantity: {m['basis']}"})
        return out

    def to_json(self) -> dict[str, Any]:
        return json_safe({
            "baseline": self.baseline, "new": self.new, "baseline_path": self.baseline_path, "new_path": self.new_path,
            "exit_code": self.exit_code, "fail_on": self.fail_on, "regressions": self.regressions(), "notes": self.notes,
            "pairs": [{"deployment": p.deployment, "baseline_deployment": p.baseline_deployment, "cause": p.cause(),
                       "changes": p.changes, "margins": p.margins, "unjudged_margins": p.unjudged,
                       "suites": [asdict(s) for s in p.suites]}
                      for p in self.pairs],
        })


def parse_margins(items: list[str]) -> dict[str, float]:
    """`suite/metric=VALUE` (or suite/category/metric) from the command line, checked as the config's are."""
    from evalkit.metrics.declarations import check_margin_key

    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError(f"--margin {item!r}: expected KEY=VALUE, KEY a margin key (suite/metric, as decision.margins)")
            check_margin_key(key.strip())
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(f"--margin {item!r}: the margin must be a finite number")
        except ValueError as e:
            raise ConfigError("--margin", str(e).replace("could not convert string to float", "not a number")) from None
        out[key.strip()] = number
    return out


def _outcome(rec: Any) -> tuple[Any, ...]:
    """What the engine produced for one record: its generation's token ids (records v3 keep them in `generation`)
    and the suite's own outcome fields."""
    fields = rec.__dict__  # a pydantic model's fields (getattr of an absent one goes through its slow __getattr__)
    generation = fields.get("generation")
    return (None if generation is None else generation.__dict__.get("output_token_ids"), *(fields.get(f) for f in OUTCOME_FIELDS))


def _open(path: Path) -> tuple[RunDir, dict[str, Any]]:
    run = RunDir.open(Path(path))
    manifest = run.manifest()
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict) or "deployment_order" not in manifest:
        raise RunDirError(str(run.manifest_path), "not an evalkit manifest (no config or deployment_order)")
    return run, manifest


def latest_comparable(new: Path, reports_dir: Path, unsaved: dict[str, Any] | None = None) -> Path:
    """The newest run under `reports_dir` created before `new` that shares a (deployment, suite) with the same
    items (no `items` field of their keys differs) and recorded items in common; NothingComparable otherwise.
    The folder's history index is read, not written: an out-of-date one's new content goes to `unsaved` (see
    history.history_entries), for the caller to save when the diff succeeds."""
    new = Path(new)
    _, manifest = _open(new)
    keys = result_keys(new, manifest)
    created = str(manifest.get("created") or "")
    from evalkit.history import item_sets

    mine = item_sets(new, manifest)
    best: tuple[str, str] | None = None
    for e in history_entries(Path(reports_dir), unsaved={} if unsaved is None else unsaved):
        if "error" in e or (reports_dir / e["name"]).resolve() == new.resolve():
            continue
        if str(e.get("created") or "") > created:
            continue
        for dep, per in (e.get("keys") or {}).items():
            for suite, key in per.items():
                if dep in keys and suite in keys[dep] and not blocking(key_changes(key, keys[dep][suite], suite)) \
                        and (e.get("items") or {}).get(dep, {}).get(suite, {}).get("n") and mine.get(dep, {}).get(suite):
                    cand = (str(e.get("created") or ""), e["name"])
                    best = cand if best is None or cand > best else best
    if best is None:
        raise NothingComparable(str(reports_dir), f"no run before {new.name} shares a deployment and suite with the "
                                                  "same items (see `evalkit history` for each run's keys)")
    return Path(reports_dir) / best[1]


def diff_runs(baseline: Path, new: Path, margins: dict[str, float] | None = None, *, pairs: list[tuple[str, str]] | None = None,
              config_margins: bool = True, fail_on: str = "inferior") -> DiffResult:
    """The paired comparison of `new` against `baseline` (see the module doc). EvalkitError (exit 2) on bad input;
    NothingComparable when no deployment and suite can be compared."""
    from evalkit.scoring import paused_gc

    with paused_gc():  # tens of thousands of records alive throughout: collections would walk them again and again
        return _diff_runs(baseline, new, margins, pairs=pairs, config_margins=config_margins, fail_on=fail_on)


def _diff_runs(baseline: Path, new: Path, margins: dict[str, float] | None, *, pairs: list[tuple[str, str]] | None,
               config_margins: bool, fail_on: str) -> DiffResult:
    import pandas as pd

    from evalkit.config import Config
    from evalkit.decision import judge_margin
    from evalkit.metrics.declarations import MarginKey
    from evalkit.scoring import records_by_suite
    from evalkit.suites import enabled_suites
    from evalkit.suites.base import ScoreContext
    from evalkit.viewer.compare import carrying_arrays

    if fail_on not in ("inferior", "inconclusive"):
        raise ConfigError("--fail-on", f"expected inferior or inconclusive, not {fail_on!r}")
    base_run, base_m = _open(baseline)
    new_run, new_m = _open(new)
    if base_run.path.resolve() == new_run.path.resolve():
        raise NothingComparable(str(new), "the baseline and the new run are the same directory")
    try:
        config = Config.model_validate(new_m["config"])
    except Exception as e:  # a manifest a newer/older evalkit wrote with a config this one refuses
        errors = getattr(e, "errors", None)
        first = errors()[0] if callable(errors) and errors() else None
        why = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(e).splitlines()[0]
        raise RunDirError(str(new_run.manifest_path), f"its config does not validate here ({why})") from None
    config_file = Path(new_m.get("config_file") or new_run.path / "config.yaml")
    wanted: dict[str, float] = {}
    if config_margins and config.decision is not None:
        wanted.update(config.decision.margins)
    wanted.update(margins or {})

    base_keys, new_keys = result_keys(base_run.path, base_m), result_keys(new_run.path, new_m)
    base_deps = [str(d) for d in base_m["deployment_order"]]
    new_deps = [str(d) for d in new_m["deployment_order"]]
    if pairs:
        for nd, bd in pairs:
            if nd not in new_deps:
                raise ConfigError("--pair", f"{nd!r} is not a deployment of {new_run.path.name} ({', '.join(new_deps)})")
            if bd not in base_deps:
                raise ConfigError("--pair", f"{bd!r} is not a deployment of {base_run.path.name} ({', '.join(base_deps)})")
    else:
        pairs = [(d, d) for d in new_deps if d in base_deps]
    if not pairs:
        raise NothingComparable(f"{base_run.path.name} vs {new_run.path.name}",
                                f"no deployment name in both runs ({', '.join(base_deps)} / {', '.join(new_deps)}); "
                                "pair them with --pair NEW=BASELINE")

    base_recs = records_by_suite(base_run, sorted({bd for _, bd in pairs}))  # only the deployments compared
    new_recs = records_by_suite(new_run, sorted({nd for nd, _ in pairs}))
    new_id, base_id = str(new_m.get("run_id") or new_run.path.name), str(base_m.get("run_id") or base_run.path.name)
    notes = []
    if (base_m["config"].get("stats") or {}) != (new_m["config"].get("stats") or {}):
        notes.append("the runs' configs set different `stats:`; intervals use the new run's")
    out: list[PairDiff] = []
    any_compared = False
    reasons: list[str] = []
    for nd, bd in pairs:
        pair = PairDiff(nd, bd, [])
        suites = {s.name: s for s in enabled_suites(config, config_file)}  # fresh: suites memoise per scoring pass
        shared_suites = [s for s in new_keys.get(nd, {}) if s in base_keys.get(bd, {})]
        if not shared_suites:
            reasons.append(f"{nd}: no suite run in both")
        for suite_name in shared_suites:
            changes = key_changes(base_keys[bd][suite_name], new_keys[nd][suite_name], suite_name)
            a = new_recs.get(suite_name, {}).get(nd, [])
            b = base_recs.get(suite_name, {}).get(bd, [])
            sd = SuiteDiff(suite_name, changes, comparable=False, baseline_items=len(b), new_items=len(a))
            pair.suites.append(sd)
            bad = blocking(changes)
            if bad:
                sd.reason = ("not comparable: its items differ (" + "; ".join(describe_change(c) for c in bad) + ")")
                reasons.append(f"{nd} {suite_name}: {sd.reason}")
                continue
            by_id_a = {r.item_id: r for r in a}
            by_id_b = {r.item_id: r for r in b}
            shared = [i for i in by_id_b if i in by_id_a]
            sd.shared_items = len(shared)
            if not shared:
                sd.reason = "no items in common"
                reasons.append(f"{nd} {suite_name}: no recorded items in common")
                continue
            sd.comparable = True
            any_compared = True
            unpaired = unpaired_metrics(changes)  # e.g. perplexity's top_k changed: its KLD figures are not compared
            sd.not_compared = sorted(unpaired)
            if _counts_outputs(suite_name):
                sd.outputs_changed = sum(_outcome(by_id_a[i]) != _outcome(by_id_b[i]) for i in shared)
            suite = suites.get(suite_name)
            if suite is None:
                sd.error = "not enabled in the new run's config: no statistics"
                continue
            mine, theirs = f"{nd} @ {new_id}", f"{bd} @ {base_id}"
            shared_set = set(shared)
            records = {theirs: carrying_arrays([r for r in b if r.item_id in shared_set], base_run.path),
                       mine: carrying_arrays([r for r in a if r.item_id in shared_set], new_run.path)}
            dep_entries = {theirs: (base_m.get("deployments") or {}).get(bd, {}),
                           mine: (new_m.get("deployments") or {}).get(nd, {})}
            sctx = ScoreContext(deployments=[theirs, mine], reference=theirs, config=config, config_file=config_file,
                                manifest={**new_m, "deployment_order": [theirs, mine], "reference": theirs,
                                          "deployments": dep_entries})
            try:
                comps = [c for c in suite.compare(records, sctx) if c.metric not in unpaired]
            except Exception as e:  # one suite that cannot pair across runs must not hide the others
                sd.error = f"{type(e).__name__}: {e}"
                continue
            for c in comps:
                sd.rows.append({**{k: json_safe(v) for k, v in asdict(replace(c, deployment=nd, reference=bd)).items()},
                                "shared_items": len(shared)})
            keys_here = [k for k in wanted if MarginKey.parse(k).suite == suite_name and MarginKey.parse(k).metric not in unpaired]
            if not keys_here:
                continue
            comps_df = pd.DataFrame([asdict(c) for c in comps], columns=COMPARISON_COLUMNS)
            # Both sides' own scores, as the decision reads them: a margin is on the paired difference where the
            # baseline has its own value of the metric (accuracy), else on the new side's value (ppl_ratio).
            score_rows: list[Any] = []
            try:
                score_rows = [r for r in suite.score(records, sctx) if r.metric not in unpaired]
            except Exception as e:
                sd.error = f"scoring for the margins: {type(e).__name__}: {e}"
            scores_df = pd.DataFrame([asdict(s) for s in score_rows],
                                     columns=["deployment", "suite", "category", "metric", "value", "ci_low", "ci_high", "n"])
            for key in keys_here:
                mk = MarginKey.parse(key)
                res = judge_margin(scores_df, comps_df, mine, theirs, key, wanted[key])
                pair.margins.append({**json_safe(asdict(res)), "suite": mk.suite, "metric": mk.metric,
                                     "category": res.category if res.category is not None else mk.category,
                                     "from_scores": res.basis == "value" and comps_df[comps_df.metric == mk.metric].empty})
        judged = {m["key"] for m in pair.margins}
        pair.unjudged = [k for k in wanted if k not in judged]
        out.append(pair)
    if not any_compared:
        raise NothingComparable(f"{base_run.path.name} vs {new_run.path.name}",
                                "nothing comparable: " + ("; ".join(reasons) if reasons else "no shared deployment and suite"))
    return DiffResult(base_id, new_id, str(base_run.path), str(new_run.path), out, fail_on, notes)


# -- output ---------------------------------------------------------------------------------------------------


def fmt_figure(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _headline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a terminal shows by default: each metric's overall category ('all') where it has one, else
    every category (prompts: one per category)."""
    cats: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        cats.setdefault((r["suite"], r["metric"]), set()).add(str(r["category"]))
    return [r for r in rows if str(r["category"]) == "all" or "all" not in cats[(r["suite"], r["metric"])]]


def format_text(result: DiffResult, *, every_row: bool = False) -> str:
    lines = [f"evalkit diff: {result.new} (new) against {result.baseline} (baseline); each difference is new minus "
             "baseline on the items both runs have, with the run's paired statistics"]
    lines += [f"note: {n}" for n in result.notes]
    for p in result.pairs:
        name = p.deployment if p.deployment == p.baseline_deployment else f"{p.deployment} (baseline: {p.baseline_deployment})"
        lines.append("")
        lines.append(f"{name}: changed: {p.cause()}")
        for s in p.suites:
            if not s.comparable:
                lines.append(f"  {s.suite}: {s.reason}")
                continue
            out = "" if s.outputs_changed is None else (
                "identical outputs" if s.outputs_changed == 0 else f"{s.outputs_changed} outputs changed")
            lines.append(f"  {s.suite}: {s.shared_items} shared items (baseline {s.baseline_items}, new {s.new_items})"
                         + (f"; {out}" if out else "") + (f"; error: {s.error}" if s.error else ""))
            if s.not_compared:
                lines.append(f"  {s.suite}: not compared (a setting that changes them differs): {', '.join(s.not_compared)}")
        verdicts = {(m["suite"], str(m["category"]), m["metric"]): m for m in p.margins}
        table = []
        for s in p.suites:
            for r in (s.rows if every_row else _headline(s.rows)):
                m = verdicts.get((r["suite"], str(r["category"]), r["metric"]))
                table.append([r["suite"], str(r["category"]), r["metric"], fmt_figure(r["reference_value"]), fmt_figure(r["value"]), fmt_figure(r["diff"]),
                              f"[{fmt_figure(r['ci_low'])}, {fmt_figure(r['ci_high'])}]", fmt_figure(r["n"]), "yes" if r["significant"] else "no",
                              fmt_figure(m["margin"]) if m else "", m["decision"] if m else ""])
        for m in p.margins:
            if m.get("from_scores"):
                table.append([m["suite"], str(m["category"]), m["metric"], "", fmt_figure(m["estimate"]), "",
                              f"[{fmt_figure(m['ci_low'])}, {fmt_figure(m['ci_high'])}]", fmt_figure(m["n"]), "", fmt_figure(m["margin"]), m["decision"]])
        if table:
            lines += ["  " + x for x in text_table(["suite", "category", "metric", "baseline", "new", "diff", "interval", "n",
                                                "significant", "margin", "verdict"], table)]
        if p.unjudged:
            lines.append(f"  not judged (suite not compared for {p.deployment}): {', '.join(p.unjudged)}")
        for m in p.margins:
            if m["decision"] == "inconclusive" and m.get("n_needed"):
                lines.append(f"  {m['key']}: inconclusive at {m['n']} items; about {m['n_needed']} would settle it")
            elif m["decision"] == "inconclusive" and m.get("note"):
                lines.append(f"  {m['key']}: inconclusive ({m['note']})")
    lines.append("")
    bad = result.regressions()
    if bad:
        what = "; ".join(f"{r['deployment']} {r['key']} {r['decision']} ({r['basis']} {fmt_figure(r['estimate'])}, interval "
                         f"[{fmt_figure(r['ci_low'])}, {fmt_figure(r['ci_high'])}], margin {fmt_figure(r['margin'])})" for r in bad)
        lines.append(f"REGRESSION (exit 1): {what}")
    elif not any(p.margins for p in result.pairs):
        lines.append("no margin applies (set decision.margins in the config or pass --margin KEY=VALUE): nothing can fail; exit 0")
    else:
        lines.append(f"no regression beyond a margin (exit 0){'; inconclusive margins do not fail (--fail-on inconclusive makes them)' if any(m['decision'] == 'inconclusive' for p in result.pairs for m in p.margins) else ''}")
    return "\n".join(lines)


def format_csv(result: DiffResult) -> str:
    rows = result.rows()
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in json_safe(r).items()})
    return buf.getvalue()


def format_json(result: DiffResult) -> str:
    return json.dumps(result.to_json(), indent=2, ensure_ascii=False, default=str)
