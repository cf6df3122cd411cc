"""The report, rendered from the session's real run (conftest.real_run: SmolLM2 Q4_1 against Q2_K on llama.cpp,
every suite) with blind ratings imported (conftest.rated_run): every section is there and its numbers are
the ones recomputed here from the JSONL records with numpy/scipy/statsmodels/sacrebleu, never read from
scores.csv or comparisons.csv. Model output stays inert: a copy whose outputs were replaced by markup
(conftest.hostile_run) is checked as text, in Markdown and in headless Chromium over the DevTools protocol
(no console errors, no script ran, nothing fetched; the first screen is saved to
test-artifacts/report-first-screen.png).
"""
from __future__ import annotations

import base64
import functools
import json
import math
import os
import re
import shutil
import signal
import string
import subprocess
import sys
import time
import unicodedata
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from ppl_records import run_records

from conftest import REAL_RUN_DEPLOYMENTS, REAL_RUN_REFERENCE, require_module, require_tool
from evalkit.report import cells as C
from evalkit.report.render import TEMPLATES, context, md_table
from evalkit.results import Run
from real_run_copies import HOSTILE, absolute_score

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
SCREEN = (1280, 900)
REF = REAL_RUN_REFERENCE
DEP = next(d for d in REAL_RUN_DEPLOYMENTS if d != REF)
DEPS = list(REAL_RUN_DEPLOYMENTS)
LETTERS = "ABCD"


# -- reading the records and the rendered tables ----------------------------------------------------


def ppl_records(run: Path, dep: str) -> list[dict[str, Any]]:
    """Scored perplexity records with their side-file arrays inline (tests/ppl_records.py)."""
    return list(run_records(run, dep).values())


def records(run: Path, dep: str, suite: str) -> list[dict[str, Any]]:
    lines = (run / "records" / f"{dep}.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["suite"] == suite]


@functools.cache
def report_context(run: Path) -> dict[str, Any]:
    """The report's context (its tables, as rendered), built once per run: it renders every plot."""
    return context(Run(run))


def tables(run: Path) -> dict[str, Any]:
    ctx = report_context(run)
    return {t.key: t for s in ctx["sections"] for t in s.tables + s.details}


def row(table: Any, first: str) -> dict[str, C.Cell]:
    """The row whose first cell is `first`, as {column header: cell}."""
    (r,) = [r for r in table.rows if r[0].value == first]
    return dict(zip(table.header, r))


def shows(text: str, expected: float, scale: float = 1.0) -> None:
    """`text` (a displayed number: "61.0%", "−0.6%", "1,661", "0.0694", "6.71 s") is `expected` × `scale` to
    the digits it shows."""
    m = re.match(r"\s*(-?[\d,]+)(?:\.(\d+))?", text.replace(C.MINUS, "-"))
    assert m, f"not a number: {text!r}"
    shown = float(m.group(0).replace(",", ""))
    tolerance = 0.5 * 10 ** -len(m.group(2) or "") + 1e-9
    assert abs(shown - expected * scale) <= tolerance, f"{text!r} shows {shown}, expected {expected * scale}"


def interval(text: str) -> tuple[float, float]:
    lo, hi = re.match(r"\[(\S+), (\S+)\]", text.replace(C.MINUS, "-")).groups()  # type: ignore[union-attr]
    return float(lo), float(hi)


# -- independent definitions (published ones, written here from the papers/tools, not imported) ------------


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalization: lower case, punctuation and articles removed, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if ch in string.punctuation else ch for ch in text)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def answer_found(output: str, answers: list[str]) -> bool:
    """A gold answer, as whole words, in the text after the last "Answer:" (the prompts ask for one)."""
    final = re.findall(r"answer\s*[:：]\s*(.+)", output, flags=re.I)
    out = f" {squad_normalize(final[-1] if final else output)} "
    return any(f" {squad_normalize(a)} " in out for a in answers if squad_normalize(a))


def seq_rep(words: list[str], n: int) -> float:
    """Welleck et al. (2019) seq-rep-n: share of n-grams that repeat an earlier one."""
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams)


def wilson(k: int, n: int) -> tuple[float, float]:
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return float(lo), float(hi)


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rated(rated_run: tuple[Path, list]) -> Path:
    return rated_run[0]


# -- formatting (no run needed) -------------------------------------------------------------------------


def test_formats_and_marks() -> None:
    assert C.fmt(0.61, "pct") == "61.0%"
    assert C.fmt_diff(-0.07, -0.15, -0.02, "pct") == "−7.0 pts [−15.0, −2.0]"
    assert C.fmt_diff(0.5, None, None, "rating") == "+0.50 (no interval)"
    assert C.fmt(float("nan")) == "–" and C.fmt(0.0025, "ms") == "2 ms"
    assert C.mark_for(-0.1, -0.2, -0.05, True, +1) == "worse"
    assert C.mark_for(-0.1, -0.2, -0.05, True, -1) == "better"  # lower is better (PPL, KLD, flips)
    assert C.mark_for(-0.1, -0.2, 0.05, False, +1) == "same"
    assert C.mark_for(0.9, None, None, False, -1) == "na"
    assert C.fmt(1.5, "mb") == "2 MB" and C.fmt(1024.0, "mb") == "1.07 GB"  # MiB recorded, 10^x shown


def test_template_never_trusts_text() -> None:
    source = re.sub(r"\{#.*?#\}", "", (TEMPLATES / "report.html.j2").read_text(), flags=re.S)  # drop comments
    assert "|safe" not in source.replace(" ", "") and "Markup(" not in source
    assert "script-src" not in source and "default-src 'none'" in source


# -- every section from the real run ---------------------------------------------------------------------


@pytest.mark.engine
def test_every_section_and_plot(rated: Path) -> None:
    ctx = report_context(rated)
    assert [s.key for s in ctx["sections"]] == ["prompts", "human", "perplexity", "mmlu", "longcontext", "humaneval",
                                                "cost", "ledger", "hardware", "environment", "numbers"]
    plots = {p.key for s in ctx["sections"] for p in s.plots}
    assert plots == {"prompts-categories", "human-ratings", "perplexity", "perplexity-positions", "mmlu-subjects",
                     "longcontext-lengths", "longcontext-recall-heatmap", "cost", "ledger"}
    files = {p.stem for p in (rated / "report_files").glob("*.png")}
    assert files == plots | {"decision"}
    assert all((rated / "report_files" / f"{k}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for k in files)
    html = (rated / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == len(files)
    assert ctx["decision"] is not None and html.index('id="decision"') < html.index('id="verdict"')


@pytest.mark.engine
def test_prompts_section(rated: Path) -> None:
    import sacrebleu

    t = tables(rated)["prompts-scores"]
    for dep in DEPS:
        recs = records(rated, dep, "prompts")
        cells = row(t, dep)
        qa = [r for r in recs if r["category"] == "qa"]
        shows(cells["QA correct"].value, sum(answer_found(r["generation"]["output_text"], r["item"]["answers"]) for r in qa) / len(qa), 100)
        reasoning = [r for r in recs if r["category"] == "reasoning"]
        found = sum(answer_found(r["generation"]["output_text"], r["item"]["answers"]) for r in reasoning)
        shows(cells["reasoning correct"].value, found / len(reasoning), 100)
        assert interval(cells["QA correct"].interval) == pytest.approx(
            [100 * x for x in wilson(sum(answer_found(r["generation"]["output_text"], r["item"]["answers"]) for r in qa), len(qa))], abs=0.051)
        shows(cells["output tokens (mean)"].value, float(np.mean([len(r["generation"]["output_token_ids"]) for r in recs])))
        for lang, tokenize in (("de", "13a"), ("zh", "zh")):  # sacrebleu's own defaults per target language
            tr = [r for r in recs if r["category"] == "translation" and r["target_lang"] == lang]
            hyps, refs = [r["generation"]["output_text"].strip() for r in tr], [[r["reference"] for r in tr]]
            shows(cells[f"BLEU en-{lang}"].value, sacrebleu.corpus_bleu(hyps, refs, tokenize=tokenize).score)
            shows(cells[f"chrF en-{lang}"].value, sacrebleu.corpus_chrf(hyps, refs).score)
    assert row(t, REF)["QA correct"].delta == "" and row(t, DEP)["QA correct"].delta  # Δ only against the reference
    md = (rated / "report.md").read_text(encoding="utf-8")
    assert "### Example: qa-" in md and "### Example: code-" in md


@pytest.mark.engine
def test_perplexity_section_and_kld_block(rated: Path) -> None:
    nll = {d: np.concatenate([r["nll"] for r in sorted(ppl_records(rated, d), key=lambda r: r["chunk_index"])])
           for d in DEPS}
    recs = sorted(ppl_records(rated, DEP), key=lambda r: r["chunk_index"])
    kld = np.concatenate([r["kld"] for r in recs])
    same_top = np.mean(np.concatenate([r["same_top"] for r in recs]))
    assert len(kld) == len(nll[DEP]) == len(nll[REF])
    ppl = {d: math.exp(float(np.mean(nll[d]))) for d in DEPS}
    dp = np.exp(-nll[DEP]) - np.exp(-nll[REF])  # change in the probability of the text's next token
    t = tables(rated)["perplexity-scores"]
    for d in DEPS:
        shows(row(t, d)["PPL"].value, ppl[d])
        shows(row(t, d)["tokens"].value, len(nll[d]))
    bpb = {d: float(np.sum(nll[d])) / math.log(2) / sum(r["n_bytes"] for r in records(rated, d, "perplexity")) for d in DEPS}
    shows(row(t, DEP)["bits/byte"].value, bpb[DEP])
    shows(row(t, DEP)["KLD mean"].value, float(np.mean(kld)))
    shows(row(t, DEP)["top-1 agreement"].value, float(same_top), 100)

    block = {r[0].value: r[1] for r in tables(rated)["perplexity-llama-block"].rows}  # llama-perplexity's rows
    expect = {
        "Mean PPL(Q)": (ppl[DEP], 1), "Mean PPL(Q)/PPL(base)": (ppl[DEP] / ppl[REF], 1),
        "Mean PPL(Q)-PPL(base)": (ppl[DEP] - ppl[REF], 1), "Mean ln(PPL(Q)/PPL(base))": (float(np.mean(nll[DEP] - nll[REF])), 1),
        "Cor(ln PPL(Q), ln PPL(base))": (float(np.corrcoef(nll[DEP], nll[REF])[0, 1]), 100),
        "Mean KLD": (float(np.mean(kld)), 1), "Maximum KLD": (float(kld.max()), 1), "Minimum KLD": (float(kld.min()), 1),
        "Median KLD": (float(np.median(kld)), 1), "99.0% KLD": (float(np.percentile(kld, 99)), 1),
        "90.0% KLD": (float(np.percentile(kld, 90)), 1), "5.0% KLD": (float(np.percentile(kld, 5)), 1),
        "Mean Δp": (float(np.mean(dp)), 100), "Maximum Δp": (float(dp.max()), 100), "Minimum Δp": (float(dp.min()), 100),
        "Median Δp": (float(np.median(dp)), 100), "RMS Δp": (float(np.sqrt(np.mean(dp ** 2))), 100),
        "Same top p": (float(same_top), 100),
    }
    for label, (value, scale) in expect.items():
        shows(block[label].value, value, scale)
    assert block["KLD"].value == f"exact against {REF}"  # the reference's full distributions were stored (llama.cpp)
    se = float(np.std(kld, ddof=1) / math.sqrt(len(kld)))  # Mean KLD ± 1.96 SE, as llama.cpp's ± is one SE
    lo, hi = interval(block["Mean KLD"].interval)
    assert lo == pytest.approx(np.mean(kld) - 1.959964 * se, abs=6e-3) and hi == pytest.approx(np.mean(kld) + 1.959964 * se, abs=6e-3)


@pytest.mark.engine
def test_mmlu_section(rated: Path) -> None:
    from scipy.stats import binomtest

    right: dict[str, dict[str, bool]] = {}
    subject: dict[str, str] = {}
    for d in DEPS:
        right[d] = {}
        for r in records(rated, d, "mmlu"):  # the prediction is the letter with the highest log-prob
            right[d][r["item_id"]] = LETTERS[int(np.argmax(r["choice_logprobs"]))] == r["gold"]
            subject[r["item_id"]] = r["category"]
    t = tables(rated)["mmlu-subjects"]
    for sub in sorted(set(subject.values())) + ["all"]:
        ids = [i for i in subject if sub in ("all", subject[i])]
        for d in DEPS:
            k = sum(right[d][i] for i in ids)
            c = row(t, sub.replace("_", " "))[d]
            shows(c.value, k / len(ids), 100)
            assert interval(c.interval) == pytest.approx([100 * x for x in wilson(k, len(ids))], abs=0.051)
    r2w = sum(right[REF][i] and not right[DEP][i] for i in subject)
    w2r = sum(not right[REF][i] and right[DEP][i] for i in subject)
    flips = row(tables(rated)["mmlu-flips"], DEP)
    assert (flips["questions"].value, flips["✓→✗ (reference right)"].value, flips["✗→✓ (reference wrong)"].value) == (
        str(len(subject)), str(r2w), str(w2r))
    shows(flips["flipped"].value, (r2w + w2r) / len(subject), 100)
    shows(flips["McNemar p"].value, binomtest(min(r2w, w2r), r2w + w2r, 0.5).pvalue if r2w + w2r else 1.0)
    listed = tables(rated).get("mmlu-flipped")
    assert len(listed.rows if listed else []) == r2w + w2r


@pytest.mark.engine
def test_longcontext_section(rated: Path) -> None:
    t = tables(rated)
    for d in DEPS:
        recs = records(rated, d, "longcontext")
        reps = {r["length_target"]: r for r in recs if r["kind"] == "rep" and "skipped" not in r}
        for length, r in reps.items():
            words = r["generation"]["output_text"].split()
            shows(row(t["longcontext-seq_rep_4"], d)[f"{length} tokens"].value, seq_rep(words, 4), 100)
            shows(row(t["longcontext-distinct_2"], d)[f"{length} tokens"].value, 1 - seq_rep(words, 2), 100)
        recall = [r for r in recs if r["kind"] == "recall"]
        found = sum(r["passkey"] in r["generation"]["output_text"] for r in recall)  # the number appears in the continuation
        shows(row(t["longcontext-recall_accuracy"], d)["all lengths"].value, found / len(recall), 100)
    md = (rated / "report.md").read_text(encoding="utf-8")
    assert "### Example: continuation after 512 tokens of context" in md


@pytest.mark.engine
def test_humaneval_section(rated: Path) -> None:
    """pass@1 = the share of tasks whose completion passes the task's own tests, each run here again in the
    sandbox (model code is untrusted) from the record's prompt, output and test."""
    from evalkit.sandbox import extract_code, run_tests

    t = tables(rated)["humaneval-scores"]
    for d in DEPS:
        recs = records(rated, d, "humaneval")
        assert len(recs) == 3
        passed = [run_tests(extract_code(r["generation"]["output_text"], r["prompt"], r["entry_point"]), r["test"], r["entry_point"],
                            timeout_s=20).passed for r in recs]
        shows(row(t, d)["pass@1"].value, sum(passed) / len(recs), 100)
        assert interval(row(t, d)["pass@1"].interval) == pytest.approx([100 * x for x in wilson(sum(passed), len(recs))], abs=0.051)


def _level(rec: dict[str, Any]) -> dict[str, float]:
    gens = [q["generation"] for q in rec["requests"]]  # each request's records.Generation
    return {"tokens_per_s": sum(len(g["output_token_ids"]) for g in gens) / rec["wall_s"],
            "per_request": float(np.median([len(g["output_token_ids"]) / g["total_s"] for g in gens])),
            "ttft": float(np.median([g["ttft_s"] for g in gens]))}


@pytest.mark.engine
def test_cost_ledger_and_decision_sections(rated: Path) -> None:
    t = tables(rated)
    levels: dict[str, dict[int, dict[str, float]]] = {}
    peak_bytes, startup = {}, {}
    for d in DEPS:
        recs = records(rated, d, "cost")
        assert {r["repeat"] for r in recs} == {1}  # one repeat: the median over repeats is that repeat
        levels[d] = {r["concurrency"]: _level(r) for r in recs}
        peak_bytes[d] = max(r["worker_peak_rss_mb"] for r in recs) * 2**20  # MiB in the records
        startup[d] = float(np.median([r["startup_s"] for r in recs]))
        for c, m in levels[d].items():
            shows(row(t["cost-tokens_per_s"], d)[str(c)].value, m["tokens_per_s"])
            shows(row(t["cost-per_request_tokens_per_s"], d)[str(c)].value, m["per_request"])
            shows(row(t["cost-ttft_median_s"], d)[str(c)].value, m["ttft"], 1000)
        start = row(t["cost-startup"], d)
        shows(start["model load"].value, startup[d])
        assert start["peak memory"].value.endswith("(RAM, worker high-water)")
        shows(start["peak memory"].value, peak_bytes[d] / (1e9 if peak_bytes[d] >= 1e9 else 1e6))

    manifest = json.loads((rated / "manifest.json").read_text(encoding="utf-8"))
    for entry in manifest["ledger"]:  # what `plan` predicted before loading, beside what the cost suite measured
        d = entry["deployment"]
        cells = row(t["ledger"], d)
        shows(cells["predicted per device"].value, entry["per_device_bytes"] / 1e9)
        shows(cells["measured peak"].value, peak_bytes[d] / 1e9)
        shows(cells["measured / predicted"].value, peak_bytes[d] / entry["per_device_bytes"])

    # The decision: Q2_K's perplexity ratio is far past the 1.05 margin (a normal interval over the per-token
    # log-ratio, computed here), so the reference is served; throughput shown is the measured one at c = 2.
    nll = {d: np.concatenate([r["nll"] for r in ppl_records(rated, d)]) for d in DEPS}
    ln_ratio = nll[DEP] - nll[REF]
    low = math.exp(float(np.mean(ln_ratio)) - 1.959964 * float(np.std(ln_ratio, ddof=1)) / math.sqrt(len(ln_ratio)))
    assert low > 1.05
    ctx = report_context(rated)
    (table,) = [x for x in ctx["decision"]["tables"] if x.key == "decision"]
    for d in DEPS:
        cells = row(table, d)
        shows(cells["tokens/s at 2 concurrent"].value, levels[d][2]["tokens_per_s"])
    assert row(table, REF)["qualifies"].value == "recommended ★"
    assert row(table, DEP)["qualifies"].value == "no" and row(table, DEP)["perplexity/ppl_ratio (margin 1.05)"].value == "inferior ✗"
    decision = json.loads((rated / "decision.json").read_text(encoding="utf-8"))
    assert decision["recommended"] == REF and decision["summary"] in (rated / "report.md").read_text(encoding="utf-8")


@pytest.mark.engine
def test_a_peak_measured_while_suites_came_from_the_cache_says_it_is_partial(rated: Path, tmp_path: Path) -> None:
    """The plan sizes every enabled suite's workload; a run whose perplexity records came from the engine-result
    cache never allocated perplexity's logit rows, so its measured peak is partial and the ratio says so. The
    real run's records are marked as a cached re-run's would be (record.cached), for one deployment only."""
    run = tmp_path / "run"
    shutil.copytree(rated, run)
    path = run / "records" / f"{DEP}.jsonl"
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert any(r["suite"] == "perplexity" for r in lines) and not any(r.get("cached") for r in lines)
    path.write_text("".join(json.dumps({**r, "cached": r["suite"] == "perplexity"}) + "\n" for r in lines), encoding="utf-8")
    ledger = tables(run)["ledger"]
    assert "(partial: perplexity answered from the cache, not in this peak)" in row(ledger, DEP)["measured / predicted"].value
    assert all("partial" not in row(ledger, d)["measured / predicted"].value for d in DEPS if d != DEP)


@pytest.mark.engine
def test_human_ratings_section(rated_run: tuple[Path, list]) -> None:
    run, written = rated_run
    t = tables(run)
    absolute = [w for w in written if w.mode == "absolute"]
    assert {w.rater for w in absolute} == {1, 2} and {w.deployment for w in absolute} == set(DEPS)
    for d in DEPS:
        for cat, label in (("code", "code"), ("qa", "QA"), ("translation", "translation")):
            scores = [int(w.value) for w in absolute if w.deployment == d and w.category == cat]
            assert scores and scores == [absolute_score(d == REF, cat, w.rater) for w in absolute
                                         if w.deployment == d and w.category == cat]
            shows(row(t["human-absolute"], d)[label].value, float(np.mean(scores)))
    pairwise = [w for w in written if w.mode == "pairwise"]
    for r in t["human-pairwise"].rows:
        cells = dict(zip(t["human-pairwise"].header, r))
        cat = {"QA": "qa"}.get(cells["category"].value, cells["category"].value)
        mine = [w.value for w in pairwise if w.deployment == cells["deployment"].value and (cat == "all" or w.category == cat)]
        assert cells["ratings"].value == str(len(mine))
        shows(cells["win"].value, mine.count("win") / len(mine), 100)
        shows(cells["tie"].value, mine.count("tie") / len(mine), 100)
        shows(cells["loss"].value, mine.count("loss") / len(mine), 100)
    assert {r[0].value for r in t["human-agreement"].rows} == {"absolute", "pairwise"}


@pytest.mark.engine
def test_hardware_parity_and_engines(rated: Path) -> None:
    t = tables(rated)
    ref_ids = {r["item_id"]: r["prompt_token_ids"] for r in records(rated, REF, "prompts")}
    dep_ids = {r["item_id"]: r["prompt_token_ids"] for r in records(rated, DEP, "prompts")}
    n, same = len(ref_ids), sum(dep_ids.get(i) == ids for i, ids in ref_ids.items())
    parity = {(r[0].value, r[1].value): r[3].value for r in t["parity"].rows}
    assert parity[("prompts", DEP)] == f"{same}/{n} identical" and same == n  # N of N, counted here
    for d in DEPS:
        engine = json.loads((rated / "engines" / f"{d}.json").read_text(encoding="utf-8"))
        cells = row(t["engines"], d)
        assert cells["chat template"].value == engine["chat_template"] == "gguf:tokenizer.chat_template"
        shows(cells["load time"].value, engine["load_s"])
        assert row(t["hardware"], d)["engine"].value == "llamacpp"


@pytest.mark.engine
def test_markdown_mirrors_tables(rated: Path) -> None:
    md = (rated / "report.md").read_text(encoding="utf-8")
    ctx = report_context(rated)
    for t in [ctx["verdict"]] + [t for s in ctx["sections"] for t in s.tables + s.details]:
        lines = md_table(t)
        assert all(line in md for line in lines if line.startswith("| ")), t.key  # every row, cell for cell
    for p in (rated / "report_files").glob("*.png"):
        assert f"](report_files/{p.name})" in md


@pytest.mark.engine
def test_prompts_only_run_without_provenance_renders(real_run: Path, tmp_path: Path) -> None:
    """Only the prompts suite, and a manifest without ledger or suite provenance (an older evalkit's run):
    only what is there is shown, and the BLEU/chrF signatures come from the metrics themselves."""
    from real_run_copies import copy_run, keep_only

    run = copy_run(real_run, tmp_path)
    keep_only(run, ("prompts",))
    ctx = context(Run(run))
    assert [s.key for s in ctx["sections"]] == ["prompts", "hardware", "environment", "numbers"]
    assert [p.key for s in ctx["sections"] for p in s.plots] == ["prompts-categories"]
    assert ctx["verdict"].header == ["deployment", "code pass@1", "reasoning correct", "translation chrF en-de",
                                     "translation chrF en-zh", "QA correct", "BLEU en-de", "BLEU en-zh"]
    sigs = {r[0].value: r[1].value for s in ctx["sections"] for t in s.tables if t.key == "signatures" for r in t.rows}
    assert sigs["prompts · chrf en-de"].startswith("nrefs:1|") and "tok:zh" in sigs["prompts · bleu en-zh"]
    assert sorted(p.name for p in (run / "report_files").iterdir()) == ["prompts-categories.png"]
    assert ctx["decision"] is None and "## Decision" not in (run / "report.md").read_text(encoding="utf-8")


# -- hostile model output stays text ------------------------------------------------------------------------


@pytest.mark.engine
def test_html_and_markdown_escape_model_output(hostile_run: Path) -> None:
    html = (hostile_run / "report.html").read_text(encoding="utf-8")
    assert "<script" not in html and "<svg" not in html and "<img src=x" not in html
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&#34;&gt;&lt;svg onload=alert(2)&gt;" in html
    md = (hostile_run / "report.md").read_text(encoding="utf-8")
    outside = re.sub(r"(`{3,})text\n.*?\n\1", "", md, flags=re.S)  # model output only inside fenced blocks
    assert "<script" not in outside and "<img" not in outside and "<svg" not in outside
    assert HOSTILE[0] in md  # verbatim inside a fence, where Markdown never interprets it


# -- headless Chromium over the DevTools protocol ---------------------------------------------------


class Cdp:
    """The few DevTools protocol calls the test needs, over one browser websocket (flattened sessions)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.get("method") == method:
                    return e
            self.events.append(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def drain(self, seconds: float) -> None:
        """Collect events for a moment (late console messages, dialogs)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-port=0"]


@contextmanager
def chromium(profile: Path) -> Iterator[Cdp]:
    exe = require_tool("chromium", "chromium-browser", "google-chrome", why="renders the HTML report")
    profile.mkdir(parents=True, exist_ok=True)
    log = (profile.parent / "chromium.log").open("wb")
    proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes "<port>\n<browser ws path>" once listening
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) == 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {(profile.parent / 'chromium.log').read_text()[-2000:]}")
            time.sleep(0.1)
        port, path = port_file.read_text().split()
        connect = require_module("websockets.sync.client", "drives Chromium (dev extra)").connect

        with connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=20) as ws:
            yield Cdp(ws)
    finally:
        # Its own session: the group id is the browser's pid, so this ends its renderers and nothing else.
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def open_page(cdp: Cdp, url: str) -> str:
    target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
    session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        cdp.call(f"{domain}.enable", session)
    cdp.call("Emulation.setDeviceMetricsOverride", session, width=SCREEN[0], height=SCREEN[1], deviceScaleFactor=1,
             mobile=False)
    cdp.events.clear()
    cdp.call("Page.navigate", session, url=url)
    cdp.wait_for("Page.loadEventFired")
    cdp.drain(1.0)
    return session


def evaluate(cdp: Cdp, session: str, expression: str) -> Any:
    res = cdp.call("Runtime.evaluate", session, expression=expression, returnByValue=True, awaitPromise=True)
    assert "exceptionDetails" not in res, res
    return res["result"].get("value")


def problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions, CSP violations and dialogs seen while the page was open."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(f"console.{p['type']}: {p.get('args')}")
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text')}")
        elif m == "Page.javascriptDialogOpening":
            out.append(f"dialog: {p.get('message')}")
    return out


def requests(events: list[dict[str, Any]]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]


def test_harness_sees_a_script_that_runs(tmp_path: Path) -> None:
    """The checks below can fail: on a page without the report's CSP, the same payload runs and is seen."""
    page = tmp_path / "unsafe.html"
    page.write_text(f"<!doctype html><title>report</title><body>{HOSTILE[0]}<script>console.error('boom')</script>")
    with chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, page.as_uri())
        assert evaluate(cdp, session, "document.title") == "pwned"
        assert any("boom" in p for p in problems(cdp.events))


@pytest.mark.engine
def test_report_is_inert_in_chromium(hostile_run: Path, tmp_path: Path) -> None:
    url = (hostile_run / "report.html").as_uri()
    with chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, url)
        title = evaluate(cdp, session, "document.title")
        state = evaluate(cdp, session, """(() => ({
            scripts: document.scripts.length,
            svgs: document.querySelectorAll('svg').length,
            onerror: document.querySelectorAll('[onerror],[onload]').length,
            text: document.body.innerText,
            images: Array.from(document.images).map(i => ({src: i.src.slice(0, 22), w: i.naturalWidth, ok: i.complete})),
            decisionTop: document.querySelector('#decision').getBoundingClientRect().top,
            verdictTop: document.querySelector('#t-verdict').getBoundingClientRect().top,
        }))()""")
        shot = cdp.call("Page.captureScreenshot", session, format="png",
                        clip={"x": 0, "y": 0, "width": SCREEN[0], "height": SCREEN[1], "scale": 1})
        events = list(cdp.events)
    ARTIFACTS.mkdir(exist_ok=True)
    png = base64.b64decode(shot["data"])
    (ARTIFACTS / "report-first-screen.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

    assert title == f"evalkit report — {Run(hostile_run).run_id}"  # not 'pwned': the injected script never ran
    assert problems(events) == []
    assert state["scripts"] == 0 and state["svgs"] == 0 and state["onerror"] == 0
    for payload in HOSTILE:
        assert payload in state["text"], payload  # shown as text
    n_plots = len(list((hostile_run / "report_files").glob("*.png")))
    assert len(state["images"]) == n_plots >= 8
    assert all(i["src"] == "data:image/png;base64," and i["ok"] and i["w"] > 300 for i in state["images"])
    assert 0 <= state["decisionTop"] < SCREEN[1] and state["decisionTop"] < state["verdictTop"]  # the decision opens it
    assert [u for u in requests(events) if not u.startswith(("file:", "data:"))] == []  # nothing from the network


def test_a_figure_showing_the_same_numbers_is_read_back_not_drawn(tmp_path: Path) -> None:
    """Kept figures (report.plots.drawn): the same spec gives the kept PNG without drawing; another spec draws; no
    memo draws every time. And importing the report imports no matplotlib (it is loaded only to draw)."""
    from evalkit.report import plots as P
    from evalkit.suites.report.cost import _draw_cost

    drawn: list[dict[str, Any]] = []

    def draw(spec: dict[str, Any]) -> bytes:
        drawn.append(spec)
        return _draw_cost(spec)

    style = {"deployments": ["a", "b"], "colors": {"a": "#444444", "b": "#1f77b4"}, "labels": {"a": "a (reference)", "b": "b"}}
    spec = {"style": style, "levels": [1, 4], "panels": [{"ylabel": m, "points": {"a": [[1, 2.0], [4, 5.5]], "b": [[1, 1.5], [4, 4.0]]}}
                                                          for m in ("x", "y", "z")]}
    with P.figure_memo(tmp_path / "figures"):
        png = P.drawn("cost", spec, draw)
        assert png.startswith(b"\x89PNG") and len(drawn) == 1
        assert P.drawn("cost", json.loads(json.dumps(spec)), draw) == png and len(drawn) == 1
        other = {**spec, "levels": [1, 8]}
        assert P.drawn("cost", other, draw) != png and len(drawn) == 2
    assert P.drawn("cost", spec, draw) == png and len(drawn) == 3  # no memo: drawn again, the same bytes
    code = "import sys, evalkit.report.render; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_difference_with_too_few_items_says_so_instead_of_an_interval() -> None:
    from evalkit.report.cells import cell, spec_for

    comp = {"diff": -0.0517, "ci_low": None, "ci_high": None, "significant": False, "n": 6, "p_value": None,
            "method": "too few items for an interval (6 < 50 paired items)"}
    c = cell({"value": 0.52, "ci_low": None, "ci_high": None}, comp, spec_for("prompts", "chrf"))
    assert c.delta_ci == "(too few items for an interval)" and c.mark == "na"
    with_ci = cell({"value": 0.52}, {**comp, "ci_low": -0.09, "ci_high": -0.01, "method": "Hall"}, spec_for("prompts", "chrf"))
    assert with_ci.delta_ci.startswith("[") and "too few" not in with_ci.delta_ci
