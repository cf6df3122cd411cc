"""Re-scoring a recorded run gives the scores it was recorded with (the records refactor changed no number).

tests/data/run-v0/ is a real llama.cpp run (Gemma 3 270M: Q4_K_M reference and its Q2_K variant; prompts,
perplexity, MMLU, long context, HumanEval and cost suites at tiny sizes; config.yaml beside it), recorded
and scored on 2026-12-01 by evalkit at commit 505d450 (`python -m evalkit run --config config.yaml
--no-cache` from a checkout of that commit): before records were typed and versioned, so its records
lines have no `schema_version` (version 0), and its scores.csv / comparisons.csv are that commit's
output. Re-scoring the same records with today's code must reproduce every recorded number: character for
character where the figure is the same bits on every host, within tests/host_tolerance.py's stated tolerance
(with identical verdicts) where it passes through numpy's exp/log or was summed by the older code's pairwise
sums. The recording was made on an AVX-512 machine; CI may run on an AVX2 one, and `make test` runs these tests a
second time under the AVX2 paths (tests/avx2_paths.py) so either kind sees what the other would.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from avx2_paths import avx2_env, avx512_features
from host_tolerance import mismatches, perplexity_figure, table, via_numpy_transcendentals

from evalkit.records import SCHEMA_VERSION, parse_record
from evalkit.scoring import COMPARISONS_CSV, SCORES_CSV, score_run
from evalkit.store import RunDir

FIXTURE = Path(__file__).parent / "data" / "run-v0"
SCORE_KEY = ("deployment", "suite", "category", "metric")
COMPARISON_KEY = ("deployment", "reference", "suite", "category", "metric")

pytestmark = pytest.mark.host_sensitive


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


def test_every_recorded_score_is_reproduced(rescored: Path) -> None:
    """Each recorded scores.csv line reappears: character for character outside the perplexity suite, within
    host_tolerance's tolerance inside it (recorded with numpy's pairwise sums and AVX-512 exp; today fsum, and
    whatever exp this host's numpy takes). Lines may be added (metrics declared since, e.g. exact-KLD
    percentiles), never changed or lost."""
    before_text = (FIXTURE / SCORES_CSV).read_text(encoding="utf-8")
    after_text = (rescored / SCORES_CSV).read_text(encoding="utf-8")
    before, after = before_text.splitlines(), after_text.splitlines()
    assert len(before) > 80 and before[0] == after[0]
    changed = mismatches(table(before_text), table(after_text), SCORE_KEY, tolerant=perplexity_figure)
    assert not changed, f"{len(changed)} recorded score figures changed or lost, e.g. {changed[:3]}"
    exact = [line for line in before[1:] if line.split(",")[1] != "perplexity"]
    assert len(exact) > 60 and not [line for line in exact if line not in set(after)]
    keys = {tuple(r[:4]) for r in csv.reader(before[1:])}
    added = [r for r in csv.reader(after[1:]) if tuple(r[:4]) not in keys]
    # Only metrics added since (perplexity's exact-KLD percentiles, cost's inter-token latency and decode tokens/s
    # per request), none replacing one.
    assert all(r[1] == "perplexity" or (r[1], r[3]) in {("cost", "itl_median_s"), ("cost", "itl_p90_s"), ("cost", "decode_tokens_per_s")}
               for r in added)


def test_every_recorded_comparison_is_reproduced_value_for_value(rescored: Path) -> None:
    """Every number and the significance verdict (`method` is prose and may be reworded): exact outside the
    perplexity suite, within host_tolerance's tolerance inside it; verdicts always exact."""
    before = table((FIXTURE / COMPARISONS_CSV).read_text(encoding="utf-8"))
    after = table((rescored / COMPARISONS_CSV).read_text(encoding="utf-8"))
    assert len(before) > 20 and sum(not perplexity_figure(r) for r in before) > 20
    changed = mismatches(before, after, COMPARISON_KEY, tolerant=perplexity_figure, ignore=("method",))
    assert not changed, f"{len(changed)} recorded comparison figures changed or lost, e.g. {changed[:3]}"


def test_rescoring_under_the_other_cpu_kinds_paths_changes_no_exact_figure(rescored: Path, tmp_path: Path) -> None:
    """The same records re-scored in a process on numpy's AVX2 paths (NPY_DISABLE_CPU_FEATURES: what an AVX2-only
    machine computes) give the very same bits for every figure but those through numpy's exp/log, and those
    within the tolerance with the same verdicts. On a machine without AVX-512 both processes take one path."""
    _, present = avx512_features()
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run, ignore=shutil.ignore_patterns(SCORES_CSV, COMPARISONS_CSV))
    proc = subprocess.run([sys.executable, "-m", "evalkit", "report", str(run)], env=avx2_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, key in ((SCORES_CSV, SCORE_KEY), (COMPARISONS_CSV, COMPARISON_KEY)):
        here = table((rescored / name).read_text(encoding="utf-8"))
        there = table((run / name).read_text(encoding="utf-8"))
        assert len(here) == len(there) > 20, name
        changed = mismatches(here, there, key, tolerant=via_numpy_transcendentals)
        assert not changed, f"{name} ({'numpy without ' + ' '.join(present) if present else 'one path'}): {changed[:5]}"
        assert sum(not via_numpy_transcendentals(r) for r in here) > 20  # most figures were compared to the bit


def test_an_earlier_run_re_scores_under_the_new_interval_methods_and_names_them(rescored: Path) -> None:
    """Issue 31: a run recorded before Tango's interval re-scores with it. Every pass/fail row's interval is the
    one its recorded discordant counts give (the counts read back from the recorded flip rows, and the method
    text), it is no longer [0, 0] where no answer flipped, and McNemar's verdict is unchanged."""
    from evalkit.metrics.stats import paired_proportion_interval

    before = {tuple(r[k] for k in COMPARISON_KEY): r for r in table((FIXTURE / COMPARISONS_CSV).read_text(encoding="utf-8"))}
    after = table((rescored / COMPARISONS_CSV).read_text(encoding="utf-8"))
    tango = [r for r in after if "Tango score interval" in r["method"]]
    assert len(tango) >= 5
    for row in tango:
        n = int(row["n"])
        r2w, w2r = (int(x) for x in row["method"].split("(")[1].replace(" right->wrong,", "").split(" wrong->right")[0].split())
        assert round((w2r - r2w) / n, 12) == round(float(row["diff"]), 12)
        lo, hi = paired_proportion_interval(w2r, r2w, n)
        assert (float(row["ci_low"]), float(row["ci_high"])) == (float(lo), float(hi))
        assert float(row["ci_low"]) <= float(row["diff"]) <= float(row["ci_high"])
        assert float(row["ci_low"]) < float(row["ci_high"])  # never a zero-width interval such as [0, 0]
        assert row["significant"] == before[tuple(row[k] for k in COMPARISON_KEY)]["significant"]
