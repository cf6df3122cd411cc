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
