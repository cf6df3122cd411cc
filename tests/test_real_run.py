"""Report, verdict and engine logs of the session's real run (conftest.real_run): every suite's records
exactly as the suites emit them today, from the real llama.cpp engine, SmolLM2-135M-Instruct Q4_1 vs Q2_K.

Expected values come from the records themselves (read here with json, not through evalkit's scoring) or
from the suites' sizes in the config. Section by section the report is checked in test_report.py, the notebooks
in test_notebooks.py, both on copies of this run (conftest.rated_run, conftest.hostile_run).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conftest import REAL_RUN_DEPLOYMENTS, REAL_RUN_REFERENCE

pytestmark = pytest.mark.engine

SUITES = ("prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost")
N_PROMPTS = 4 * 3  # four categories, limit_per_category 3


def _records(run: Path, dep: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "records" / f"{dep}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_every_suite_ran_on_the_real_engine(real_run: Path) -> None:
    for dep in REAL_RUN_DEPLOYMENTS:
        by_suite: dict[str, list[dict[str, Any]]] = {}
        for r in _records(real_run, dep):
            by_suite.setdefault(r["suite"], []).append(r)
        assert set(by_suite) == set(SUITES), dep
        assert len(by_suite["prompts"]) == N_PROMPTS and len(by_suite["humaneval"]) == 3
        assert all(r["generation"]["output_token_ids"] for r in by_suite["prompts"])
        engine = json.loads((real_run / "engines" / f"{dep}.json").read_text())
        assert engine["engine"] == "llamacpp" and engine["chat_template"] == "gguf:tokenizer.chat_template"
        assert 1 <= engine["extra"]["n_threads"] <= len(__import__("os").sched_getaffinity(0))  # free cores we may use
        assert "bit-identical" in engine["extra"]["sampling_reproducibility"]


def test_humaneval_ran_real_completions_in_the_sandbox(real_run: Path) -> None:
    recs = [r for r in _records(real_run, REAL_RUN_REFERENCE) if r["suite"] == "humaneval"]
    assert [r["item_id"] for r in recs] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(r["generation"]["output_token_ids"] and r["generation"]["finish_reason"] in ("stop", "length") for r in recs)
    items = pd.read_csv(real_run / "items" / "humaneval.csv", encoding="utf-8-sig")
    assert len(items) == 3 * len(REAL_RUN_DEPLOYMENTS)
    assert set(items["status"]) <= {"passed", "failed", "timeout", "error", "no_code"}
    scores = pd.read_csv(real_run / "scores.csv")
    p1 = scores[(scores.suite == "humaneval") & (scores.metric == "pass@1")].set_index("deployment").value
    for dep in REAL_RUN_DEPLOYMENTS:  # pass@1 is the share of passed items, from the item rows
        passed = items[items.deployment == dep]["passed"].astype(bool).mean()
        assert p1[dep] == pytest.approx(passed)


def test_parity_is_all_identical(real_run: Path) -> None:
    """Both deployments run one GGUF tokenizer and chat template: every prompt's tokens are identical, N of N."""
    parity = pd.read_csv(real_run / "parity.csv", encoding="utf-8-sig")
    summary = parity[parity.item_id.astype(str) == "*"].set_index("suite")
    n = N_PROMPTS
    assert summary.loc["prompts", "status"] == f"{n}/{n} identical"
    ref = {r["item_id"]: r["prompt_token_ids"] for r in _records(real_run, REAL_RUN_REFERENCE) if r["suite"] == "prompts"}
    other = {r["item_id"]: r["prompt_token_ids"] for r in _records(real_run, "q2k") if r["suite"] == "prompts"}
    assert ref == other and len(ref) == n  # the independent check of the same claim


def test_report_renders_every_suite_from_real_records(real_run: Path) -> None:
    from evalkit.report.render import context
    from evalkit.results import Run

    ctx = context(Run(real_run))
    keys = [s.key for s in ctx["sections"]]
    for suite in SUITES:
        assert suite in keys, suite
    assert "ledger" in keys and "hardware" in keys
    verdict = ctx["verdict"]
    assert [r[0].value for r in verdict.rows] == list(REAL_RUN_DEPLOYMENTS)
    # The verdict's MMLU accuracy cell is the share of correct records (counted here from the JSON lines).
    header = verdict.header
    col = next(i for i, h in enumerate(header) if h.endswith(" accuracy"))  # "<MMLU or evalkit-mc label> accuracy"
    for row in verdict.rows:
        recs = [r for r in _records(real_run, row[0].value) if r["suite"] == "mmlu"]
        acc = sum(bool(r["correct"]) for r in recs) / len(recs)
        assert row[col].value == f"{acc * 100:.1f}%"
    html = (real_run / "report.html").read_text(encoding="utf-8")
    assert html.count("<section") >= len(SUITES)


def test_verdict_traces_to_comparisons(real_run: Path) -> None:
    from evalkit.report import cells as C
    from evalkit.report.render import context
    from evalkit.results import Run

    run = Run(real_run)
    v = context(run)["verdict"]
    cell = {(r[0].value, h): c for r in v.rows for h, c in zip(v.header, r)}
    acc = next(h for h in v.header if h.endswith(" accuracy"))
    comps = run.comparisons.set_index(["deployment", "suite", "category", "metric"])
    mmlu = comps.loc[("q2k", "mmlu", "all", "accuracy")]
    assert cell[("q2k", acc)].diff == C.fmt_diff(mmlu["diff"], mmlu["ci_low"], mmlu["ci_high"], "pct")
    assert cell[(REAL_RUN_REFERENCE, acc)].diff == ""


def test_engine_logs_stay_out_of_the_terminal(real_run: Path) -> None:
    terminal = (real_run.parent / "terminal.txt").read_text(encoding="utf-8")
    for dep in REAL_RUN_DEPLOYMENTS:
        assert (real_run / "logs" / f"{dep}.log").is_file()
        assert f"{dep} · prompts" in terminal  # evalkit's own progress is there
    assert "elapsed" in terminal and "left" in terminal  # the run-wide line
    assert "llama_" not in terminal and "ggml_" not in terminal  # llama.cpp's C-level log lines are not


def test_prompt_suite_discriminates(real_run: Path) -> None:
    """SmolLM2-Instruct through its chat template answers the prompts: every deployment scores above zero in
    at least one category (Gemma 270M base scored 0 on code, reasoning and QA everywhere)."""
    items = pd.read_csv(real_run / "items" / "prompts.csv", encoding="utf-8-sig")
    ok = items["pass"].fillna(items["contains"]) if "contains" in items else items["pass"]
    items = items.assign(ok=ok)
    for dep in REAL_RUN_DEPLOYMENTS:
        rows = items[(items.deployment == dep) & items.category.isin(["code", "reasoning", "qa"])]
        assert rows.ok.fillna(0).astype(float).sum() > 0, dep
