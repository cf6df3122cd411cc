"""Records are append-only and crash-safe: a torn last line is ignored by readers and cut by writers."""
from __future__ import annotations

import json
from pathlib import Path

from evalkit.store import RecordWriter, RunDir, read_jsonl


def test_torn_tail_is_ignored_then_repaired(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as w:
        w.write_batch([{"suite": "s", "item_id": "1"}, {"suite": "s", "item_id": "2"}])
    with path.open("ab") as f:
        f.write(b'{"suite": "s", "item_')
    assert [r["item_id"] for r in read_jsonl(path)] == ["1", "2"]
    with RecordWriter(path) as w:
        w.write_batch([{"suite": "s", "item_id": "3"}])
    lines = path.read_bytes().splitlines()
    assert [json.loads(l)["item_id"] for l in lines] == ["1", "2", "3"]


def test_run_dir_keeps_first_record_per_item(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "r1")
    run.write_manifest({"run_id": "r1"})
    with run.writer("dep") as w:
        w.write_batch([{"suite": "s", "item_id": "a", "v": 1}, {"suite": "s", "item_id": "a", "v": 2}])
    assert [r["v"] for r in RunDir.open(run.path).records("dep")] == [1]
    assert run.done_keys("dep") == {"s/a"}
    assert RunDir.create(tmp_path, "r1").path.name == "r1-2"  # never reuses an existing directory


def test_complete_json_without_its_newline_is_not_done(tmp_path: Path) -> None:
    """A kill between the object and its newline: the writer will cut the line, so resume must re-run it."""
    run = RunDir.create(tmp_path, "r")
    path = run.records_path("dep")
    path.write_bytes(b'{"suite":"s","item_id":"1"}\n{"suite":"s","item_id":"2"}')  # valid JSON, no newline
    assert run.done_keys("dep") == {"s/1"}
    with run.writer("dep") as w:
        w.write_batch([{"suite": "s", "item_id": "2", "again": True}])
    assert [r["item_id"] for r in read_jsonl(path)] == ["1", "2"]
    assert run.records("dep")[1]["again"] is True


def test_a_corrupt_complete_line_is_an_error_with_its_line_number(tmp_path: Path) -> None:
    import pytest

    from evalkit.errors import RunDirError

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"suite":"s","item_id":"1"}\n{"suite":"s",garbage}\n{"suite":"s","item_id":"3"}\n')
    with pytest.raises(RunDirError, match=r"r\.jsonl:2: corrupt record"):
        list(read_jsonl(path))


def _slow_writer(path: str, started: "object") -> None:
    """A live writer in the middle of a batch: half a line on disk, the rest a moment later (lock held)."""
    import time

    from filelock import FileLock

    from evalkit.store import lock_path

    with FileLock(lock_path(Path(path))), open(path, "ab") as f:
        f.write(b'{"suite":"s","item_id":"slow",')
        f.flush()
        started.set()  # type: ignore[attr-defined]
        time.sleep(1.5)
        f.write(b'"pad":"x"}\n')


def test_a_writer_never_cuts_or_glues_onto_a_live_writers_half_written_batch(tmp_path: Path) -> None:
    """Tail repair is only safe when no live writer is mid-batch: appends and repair hold the file's lock."""
    import multiprocessing as mp

    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"suite":"s","item_id":"first"}\n')
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    slow = ctx.Process(target=_slow_writer, args=(str(path), started))
    slow.start()
    assert started.wait(60)
    with RecordWriter(path) as w:  # waits for the slow writer, then sees a whole last line
        w.write_batch([{"suite": "s", "item_id": "second"}])
    slow.join(60)
    assert slow.exitcode == 0
    assert [r["item_id"] for r in read_jsonl(path)] == ["first", "slow", "second"]
    assert path.read_bytes().endswith(b"\n")


def _create(out: str, start: "object", q: "object") -> None:
    start.wait()  # type: ignore[attr-defined]
    # many creations each, so the processes really contend for the same names
    q.put([RunDir.create(Path(out), "same-second").path.name for _ in range(REPEATS)])  # type: ignore[attr-defined]


REPEATS, CREATORS = 60, 6


def test_run_dirs_created_at_once_with_one_name_get_distinct_directories(tmp_path: Path) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, q = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_create, args=(str(tmp_path), start, q)) for _ in range(CREATORS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0  # a collision would be FileExistsError in one of them
    names = sorted(n for _ in procs for n in q.get(timeout=5))
    expected = ["same-second"] + [f"same-second-{i}" for i in range(2, REPEATS * CREATORS + 1)]
    assert names == sorted(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)


def test_a_run_dir_in_use_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    run = RunDir.create(tmp_path, "r")
    with run.exclusive():
        # another process: flock locks are per open file, so the refusal is what a second evalkit would see
        code = "import sys; from evalkit.store import RunDir; RunDir(sys.argv[1]).exclusive().__enter__()"
        proc = subprocess.run([sys.executable, "-c", code, str(run.path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "in use by another evalkit process" in proc.stderr
    with run.exclusive():  # released: usable again
        pass
