"""The run-wide progress line: fraction, elapsed and time left, against hand-computed figures."""
from __future__ import annotations

from pathlib import Path

from evalkit.progress import RunProgress


def test_estimate_weighs_items_by_their_suite_rate(tmp_path: Path) -> None:
    p = RunProgress.start(tmp_path, {"ref": {"prompts": 10, "mmlu": 100}, "q4": {"prompts": 10, "mmlu": 100}})
    p.started = 1000.0
    assert p.line(now=1000.0) == "run 0% · 0s elapsed · estimating time left"
    p.record("ref", "prompts", 10, 50.0)  # 5 s per generated answer
    p.record("ref", "mmlu", 50, 10.0)  # 0.2 s per MMLU item
    # Left: ref mmlu 50 x 0.2 = 10 s; q4 prompts 10 x 5 (ref's prompts rate) = 50 s; q4 mmlu 100 x 0.2 = 20 s.
    # Work 80 s; elapsed 90 s over 60 s measured (engine start-up) scales it by 1.5: 120 s.
    assert p.remaining_s(now=1090.0) == 120.0
    assert p.line(now=1090.0) == "run 27% · 1m30s elapsed · ~2m00s left"  # 60 of 220 items
    again = RunProgress.load(tmp_path)  # what the next worker process reads
    assert again is not None and again.done == p.done and again.seconds == p.seconds


def test_no_plan_no_line(tmp_path: Path) -> None:
    assert RunProgress.load(tmp_path) is None
    (tmp_path / "progress.json").write_text("{not json")
    assert RunProgress.load(tmp_path) is None


def _record_many(run_dir: str, deployment: str, times: int) -> None:
    progress = RunProgress.load(Path(run_dir))
    assert progress is not None
    for _ in range(times):
        progress.record(deployment, "perplexity", 1, 0.5)


def test_workers_running_at_once_each_add_their_own_figures(tmp_path: Path) -> None:
    """A streaming-KLD group runs its workers at once, each holding the progress it loaded at its start: every
    one's finished items must stay in the file (they once overwrote each other's, leaving the last writer's)."""
    import multiprocessing

    RunProgress.start(tmp_path, {d: {"perplexity": 300} for d in ("ref", "q4", "q2k")})
    procs = [multiprocessing.get_context("spawn").Process(target=_record_many, args=(str(tmp_path), d, 300))
             for d in ("ref", "q4", "q2k")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    final = RunProgress.load(tmp_path)
    assert final is not None
    assert final.done == {d: {"perplexity": 300} for d in ("ref", "q4", "q2k")}
    assert final.seconds == {d: {"perplexity": 150.0} for d in ("ref", "q4", "q2k")}
    assert final.fraction() == 1.0
