"""Typed, versioned records: every line carries schema_version; old layouts upgrade; newer ones are refused."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evalkit.engines.base import GenResult
from evalkit.errors import RunDirError
from evalkit.records import (
    SCHEMA_VERSION, CostRecord, Generation, HumanEvalRecord, LongContextRecord, MmluRecord, PerplexityRecord, PromptRecord, dump_record,
    parse_record,
    provenance,
)

PROMPT_V0 = {  # a prompts line as evalkit wrote it before records were versioned
    "suite": "prompts", "item_id": "qa-01", "category": "qa", "prompt": "Capital of France?", "prompt_format": "chat",
    "prompt_token_ids": [2, 10, 11], "output_text": "Answer: Paris", "output_token_ids": [5, 6], "n_prompt_tokens": 3,
    "n_output_tokens": 2, "finish_reason": "stop", "ttft_s": 0.1, "total_s": 0.3, "reference": None,
    "target_lang": None, "item": {"id": "qa-01", "category": "qa", "prompt": "Capital of France?", "answers": ["Paris"]},
}


def test_v0_line_is_upgraded() -> None:
    rec = parse_record(PROMPT_V0)
    assert isinstance(rec, PromptRecord)
    assert rec.schema_version == SCHEMA_VERSION == 3
    assert rec.cached is False and rec.measured_at is None  # nothing in a v0 line says otherwise
    assert rec.generation.output_text == "Answer: Paris" and rec.item["answers"] == ["Paris"]
    assert rec.generation == Generation(output_text="Answer: Paris", output_token_ids=[5, 6], finish_reason="stop",
                                        ttft_s=0.1, total_s=0.3)  # v3: the flat fields nested as the shared part


def real_records(run: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((run / "records").glob("*.jsonl")) for line in p.read_text().splitlines()]


@pytest.mark.engine
def test_v0_cost_line_keeps_its_provenance(real_run: Path) -> None:
    cost = next(r for r in real_records(real_run) if r["suite"] == "cost")
    old = {k: v for k, v in cost.items() if k != "schema_version"} | {"cached": True, "measured_at": "2025-03-01T12:00:00+00:00"}
    rec = parse_record(old)
    assert isinstance(rec, CostRecord) and rec.cached and rec.measured_at == "2025-03-01T12:00:00+00:00"


def test_dump_carries_schema_version_and_round_trips() -> None:
    rec = parse_record(PROMPT_V0)
    line = dump_record(rec)
    assert line["schema_version"] == SCHEMA_VERSION and json.loads(json.dumps(line)) == line
    assert parse_record(line) == rec


def test_newer_version_is_refused_naming_it() -> None:
    with pytest.raises(RunDirError, match=r"schema_version 7 is newer .*up to 3"):
        parse_record(PROMPT_V0 | {"schema_version": 7}, "records/x.jsonl")


def test_malformed_record_is_one_line_naming_field() -> None:
    bad = PROMPT_V0 | {"total_s": "long"}
    with pytest.raises(RunDirError, match=r"prompts record 'qa-01': generation.total_s"):
        parse_record(bad)
    with pytest.raises(RunDirError, match="unknown suite 'nope'"):
        parse_record({"suite": "nope", "item_id": "1", "category": "x"})


def test_records_are_frozen() -> None:
    rec = parse_record(PROMPT_V0)
    with pytest.raises(ValidationError, match="frozen"):
        rec.prompt = "changed"  # type: ignore[misc]


def test_provenance_from_engine_results() -> None:
    fresh = GenResult("k", [1], "x", [2], "chat", "stop", 0.1, 0.2)
    p = provenance(fresh)
    assert p["cached"] is False and p["measured_at"] and p["measured_at"].endswith("+00:00")
    hit = GenResult("k", [1], "x", [2], "chat", "stop", 0.1, 0.2, cached=True, measured_at="2025-01-01T00:00:00+00:00")
    assert provenance(hit) == {"cached": True, "measured_at": "2025-01-01T00:00:00+00:00"}
    unknown = GenResult("k", [1], "x", [2], "chat", "stop", 0.1, 0.2, cached=True, measured_at=None)  # an old entry
    assert provenance(unknown) == {"cached": True, "measured_at": None}  # a hit never claims "measured now"
    assert hit == fresh  # provenance is not part of a result's value


def test_provenance_of_a_record_made_from_several_results() -> None:
    from evalkit.records import combined

    t1, t2 = "2025-01-01T00:00:00+00:00", "2025-01-02T09:30:00+00:00"
    hit1, hit2, fresh2 = {"cached": True, "measured_at": t1}, {"cached": True, "measured_at": t2}, {"cached": False, "measured_at": t2}
    assert combined([hit2, hit1]) == {"cached": True, "measured_at": t2}  # the newest number in it
    assert combined([hit1, fresh2]) == {"cached": False, "measured_at": t2}  # partly computed now: not cached
    assert combined([hit1, {"cached": True, "measured_at": None}]) == {"cached": True, "measured_at": None}


@pytest.mark.engine
def test_every_suite_of_the_real_run_parses_to_its_type(real_run: Path) -> None:
    types = {"prompts": PromptRecord, "perplexity": PerplexityRecord, "mmlu": MmluRecord, "longcontext": LongContextRecord,
             "humaneval": HumanEvalRecord, "cost": CostRecord}
    raws = real_records(real_run)
    assert {r["suite"] for r in raws} == set(types)
    for raw in raws:
        rec = parse_record(raw)
        if raw["suite"] in types:
            assert isinstance(rec, types[raw["suite"]])
        assert dump_record(rec)["schema_version"] == SCHEMA_VERSION


@pytest.mark.engine
def test_report_refuses_a_newer_run_with_one_line_and_writes_nothing(real_run: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(real_run, tmp_path / real_run.name))
    path = next((run / "records").glob("*.jsonl"))
    lines = path.read_text().splitlines()
    lines[0] = json.dumps(json.loads(lines[0]) | {"schema_version": 99})
    path.write_text("\n".join(lines) + "\n")
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    res = subprocess.run([sys.executable, "-m", "evalkit", "report", str(run)], capture_output=True, text=True)
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "schema_version 99" in err[0] and path.name in err[0]
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before


@pytest.mark.engine
def test_real_engine_records_say_whether_and_when_they_were_measured(gemma_engine, tmp_path: Path) -> None:
    """Every suite on llama.cpp through evalkit's result cache, run twice: the first run's records are fresh and
    measured within the run's time window; the second run's are all served from the cache and carry the first
    run's times. Cache entries stored before entries kept the time (simulated by deleting it) give None.
    Perplexity runs both ways: top-k scoring (score_span) and, as a run's reference, full distributions."""
    from evalkit.cache import CachedEngine, key_parts_from_info
    from evalkit.config import (
        CostSettings, HumanEvalSettings, LongContextSettings, MmluSettings, PerplexitySettings, PromptsSettings,
    )
    from evalkit.engines.base import SamplingParams
    from evalkit.resources import resource_path
    from evalkit.suites.base import RunBinding
    from evalkit.suites.code import HumanEvalSuite
    from evalkit.suites.cost import CostSuite
    from evalkit.suites.longcontext import LongContextSuite
    from evalkit.suites.mmlu import MmluSuite
    from evalkit.suites.perplexity import PerplexitySuite
    from evalkit.suites.prompts import PromptsSuite

    config_file = resource_path("default.yaml")
    task = {"task_id": "T/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
            "entry_point": "add", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}
    (tmp_path / "he.jsonl").write_text(json.dumps(task) + "\n")
    reference_ppl = PerplexitySuite(PerplexitySettings(n_ctx=64, max_chunks=1, top_k=5), None, config_file)  # type: ignore[arg-type]
    reference_ppl.bind(RunBinding(tmp_path / "run", "ref", "ref"))  # the reference: full distributions, stored
    suites = [
        PromptsSuite(PromptsSettings(categories=["qa"], limit_per_category=2), None, config_file),  # type: ignore[arg-type]
        PerplexitySuite(PerplexitySettings(n_ctx=64, max_chunks=1, top_k=5), None, config_file),  # type: ignore[arg-type]
        reference_ppl,
        MmluSuite(MmluSettings(source="builtin", subjects=["arithmetic"], per_subject=2, shots=0), None, config_file),  # type: ignore[arg-type]
        LongContextSuite(LongContextSettings(lengths=[128], depths=[0.5], continuation_tokens=4), None, config_file),  # type: ignore[arg-type]
        HumanEvalSuite(HumanEvalSettings(path=str(tmp_path / "he.jsonl"), limit=1), None, config_file),  # type: ignore[arg-type]
        CostSuite(CostSettings(concurrency=[1], prompt_tokens=8, output_tokens=4, repeats=1), None, config_file),  # type: ignore[arg-type]
    ]
    parts = key_parts_from_info(gemma_engine.info(), None, gemma_engine.options)
    cache = tmp_path / "cache"

    # Suites whose cache entry is a whole stored measurement carrying its own time (the cost suite's record,
    # a perplexity chunk: since records v2 its scalars + side-file hash, top-k or full-distribution path alike)
    # rather than an engine result.
    whole = {id(suites[1]), id(reference_ppl), id(suites[-1])}

    def run() -> tuple[list[tuple[bool, Any]], datetime, datetime]:
        engine = CachedEngine(gemma_engine, parts, root=cache, measurements=True)  # as the worker's
        start = datetime.now(timezone.utc).replace(microsecond=0)  # measured_at is to the second
        out: list[tuple[bool, Any]] = []
        for suite in suites:
            lines: list[dict] = []
            suite.run(engine, suite.items(), SamplingParams(max_tokens=8), lines.extend)
            out += [(id(suite) in whole, parse_record(r)) for r in lines]
        return out, start, datetime.now(timezone.utc)

    first_run, start, end = run()
    first = [r for _, r in first_run]
    second = [r for _, r in run()[0]]
    assert {r.suite for r in first} == {"prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost"}
    assert any(isinstance(r, PerplexityRecord) and r.store_sha256 for r in first)  # the full-distribution path ran
    assert not any(getattr(r, "skipped", None) for r in first)
    for r in first:
        assert r.schema_version == SCHEMA_VERSION and r.cached is False and r.measured_at, (r.suite, r.item_id)
        assert start <= datetime.fromisoformat(r.measured_at) <= end, (r.suite, r.item_id, r.measured_at)
    assert [(r.suite, r.item_id) for r in second] == [(r.suite, r.item_id) for r in first]
    for a, b in zip(first, second):
        assert b.cached is True and b.measured_at == a.measured_at, (b.suite, b.item_id)
        assert a.model_dump(exclude={"cached", "measured_at", "timings"}) == b.model_dump(exclude={"cached", "measured_at", "timings"})

    # Entries written before entries kept the time: a hit says "unknown", never a made-up time. (A whole
    # stored measurement keeps the time inside it and is not affected.)
    for path in cache.rglob("*.json"):
        entry = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in entry.items() if k != "measured_at"}))
    old = run()[0]
    assert [r.cached for _, r in old] == [True] * len(first)
    assert [r.measured_at for _, r in old] == [a.measured_at if is_whole else None for (is_whole, _), a in zip(old, first)]


def test_version_2_generations_are_nested_as_one_part() -> None:
    """Before version 3 each generating suite copied the generation into its own shape: prompts and HumanEval flat,
    long context with a nested `timings`, cost requests flat with `output_tokens` and no text. All read back as the
    same `Generation`."""
    lc = {"schema_version": 2, "suite": "longcontext", "item_id": "rep/L512", "category": "L512", "kind": "rep",
          "length_target": 512, "filler_repeats": 3, "n_prompt_tokens": 512, "output_text": "a b c",
          "output_token_ids": [1, 2, 3], "n_output_tokens": 3, "finish_reason": "length",
          "timings": {"ttft_s": 0.5, "total_s": 0.9}}
    rec = parse_record(lc)
    assert rec.generation == Generation(output_text="a b c", output_token_ids=[1, 2, 3], finish_reason="length",
                                        ttft_s=0.5, total_s=0.9)
    assert rec.generation.n_output_tokens == 3 and "timings" not in dump_record(rec)
    skipped = parse_record({k: v for k, v in lc.items() if k in ("schema_version", "suite", "item_id", "category", "kind",
                                                                 "length_target", "filler_repeats")} | {"skipped": "too long"})
    assert skipped.generation is None and skipped.output == ""
    request = {"key": "q0", "prompt_tokens": 4, "output_tokens": 2, "finish_reason": "length", "ttft_s": 0.1,
               "total_s": 0.3, "prompt_token_ids": [1, 2, 3, 4], "output_token_ids": [5, 6]}
    cost = {"schema_version": 2, "suite": "cost", "item_id": "c1/r1", "category": "c1", "concurrency": 1, "repeat": 1,
            "prompt_tokens": 4, "output_tokens_requested": 2, "ignore_eos": True, "prompt_construction": "x", "wall_s": 0.3,
            "requests": [request], "baseline_rss_mb": 1.0, "peak_rss_mb": 2.0, "startup_s": 1.0, "warmup_s": 0.1,
            "engine": "llamacpp", "engine_version": "0", "sampling": {}}
    (req,) = parse_record(cost).requests
    assert req.generation == Generation(output_text=None, output_token_ids=[5, 6], finish_reason="length", ttft_s=0.1,
                                        total_s=0.3)  # the text was never kept: None, not made up
    assert req.generation.text == "" and req.prompt_token_ids == [1, 2, 3, 4]


@pytest.mark.engine
def test_records_read_from_bytes_equal_the_dict_path(real_run: Path, tmp_path: Path) -> None:
    """scoring.records_by_suite parses current lines straight from their bytes (issue 36's speed): every suite's
    records, plus a duplicate (the first wins), a line without its deployment, a v0 line and a v2 line, come out
    equal to json.loads + parse_record of RunDir.records, the path it replaced; a bad line is the same error."""
    from evalkit.scoring import records_by_suite
    from evalkit.store import RunDir

    run = Path(shutil.copytree(real_run, tmp_path / real_run.name, ignore=shutil.ignore_patterns("items", "*.csv")))
    path = sorted((run / "records").glob("*.jsonl"))[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    dup = json.dumps(first | {"cached": not first.get("cached")})  # same item again: must not replace the first
    no_dep = {k: v for k, v in json.loads(lines[1]).items() if k != "deployment"}
    v0 = PROMPT_V0 | {"item_id": "qa-v0"}
    v2 = {k: v for k, v in PROMPT_V0.items()} | {"item_id": "qa-v2", "schema_version": 2, "cached": False}
    path.write_text("\n".join([lines[0], json.dumps(no_dep), *lines[2:], dup, json.dumps(v0), json.dumps(v2)]) + "\n",
                    encoding="utf-8")
    rundir = RunDir.open(run)
    deps = sorted(p.stem for p in (run / "records").glob("*.jsonl"))
    expected: dict[str, dict[str, list[Any]]] = {}
    for dep in deps:
        for raw in rundir.records(dep):
            rec = parse_record({**raw, "deployment": raw.get("deployment") or dep})
            expected.setdefault(rec.suite, {}).setdefault(dep, []).append(rec)
    got = records_by_suite(rundir, deps)
    assert got == expected
    mine = got["prompts"][path.stem]
    assert any(r.item_id == "qa-v0" for r in mine) and any(r.item_id == "qa-v2" for r in mine)
    assert sum(len(v) for per in got.values() for v in per.values()) == sum(len(rundir.records(d)) for d in deps)
    path.write_text(path.read_text(encoding="utf-8") + json.dumps(json.loads(lines[2]) | {"item_id": "bad", "category": 7}) + "\n",
                    encoding="utf-8")
    with pytest.raises(RunDirError) as fast:
        records_by_suite(rundir, deps)
    with pytest.raises(RunDirError) as slow:
        for raw in rundir.records(path.stem):
            parse_record({**raw, "deployment": raw.get("deployment") or path.stem}, str(path))
    assert str(fast.value) == str(slow.value) and "'bad'" in str(fast.value) and "category" in str(fast.value)
