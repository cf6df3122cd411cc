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
