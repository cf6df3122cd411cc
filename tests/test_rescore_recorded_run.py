"""Re-scoring a recorded run gives the scores it was recorded with (the records refactor changed no number).

tests/data/run-v0/ is a real llama.cpp run (Gemma 3 270M: Q4_K_M reference and its Q2_K variant; prompts,
perplexity, MMLU, long context, HumanEval and cost suites at tiny sizes; config.yaml beside it), recorded
and scored on 2026-12-01 by evalkit at commit 505d450 (`python -m evalkit run --config config.yaml
--no-cache` from a checkout of that commit): before records were typed and versioned, so its records
lines have no `schema_version` (version 0), and its scores.csv / comparisons.csv are that commit's
output. Re-scoring the same records with today's code must reproduce every recorded number.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from evalkit.records import SCHEMA_VERSION, parse_record
from evalkit.scoring import COMPARISONS_CSV, SCORES_CSV, score_run
from evalkit.store import RunDir

FIXTURE = Path(__file__).parent / "data" / "run-v0"


def _table(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture(scope="module")
def rescored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("rescore") / "run"
    shutil.copytree(FIXTURE, run, ignore=shutil.ignore_patterns(SCORES_CSV, COMPARISONS_CSV))
    score_run(RunDir.open(run))
    return run


def test_fixture_is_an_unversioned_real_run() -> None:
    lines = [json.loads(x) for p in (FIXTURE / "records").glob("*.jsonl") for x in p.read_text().splitlines()]
    assert lines and all("schema_version" not in r for r in lines)
    assert {r["suite"] for r in lines} == {"prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost"}
    assert all(parse_record(r).schema_version == SCHEMA_VERSION for r in lines)


def test_every_recorded_score_is_reproduced_exactly(rescored: Path) -> None:
    """Each recorded scores.csv line reappears character for character. Lines may be added (metrics
    declared since, e.g. exact-KLD percentiles), never changed or lost."""
    before = (FIXTURE / SCORES_CSV).read_text(encoding="utf-8").splitlines()
    after = (rescored / SCORES_CSV).read_text(encoding="utf-8").splitlines()
    assert len(before) > 80 and before[0] == after[0]
    missing = [line for line in before if line not in set(after)]
    assert not missing, f"{len(missing)} recorded score lines changed or lost, e.g. {missing[:3]}"
    keys = {tuple(r[:4]) for r in csv.reader(before[1:])}
    added = [r for r in csv.reader(after[1:]) if tuple(r[:4]) not in keys]
    # Only metrics added since (perplexity's exact-KLD percentiles, cost's inter-token latency and decode tokens/s
    # per request), none replacing one.
    assert all(r[1] == "perplexity" or (r[1], r[3]) in {("cost", "itl_median_s"), ("cost", "itl_p90_s"), ("cost", "decode_tokens_per_s")}
               for r in added)


def test_every_recorded_comparison_is_reproduced_value_for_value(rescored: Path) -> None:
    before = _table((FIXTURE / COMPARISONS_CSV).read_text(encoding="utf-8"))
    after = {(r["deployment"], r["suite"], r["category"], r["metric"]): r
             for r in _table((rescored / COMPARISONS_CSV).read_text(encoding="utf-8"))}
    assert len(before) > 20
    for old in before:
        new = after[(old["deployment"], old["suite"], old["category"], old["metric"])]
        # Every number and the significance verdict; `method` is prose and may be reworded.
        assert {k: new[k] for k in old if k != "method"} == {k: v for k, v in old.items() if k != "method"}
