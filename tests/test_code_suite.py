"""HumanEval loading, sandboxed scoring from records, paired comparison; the prompts suite's code items."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from conftest import SHARED_DATA, unavailable
from evalkit.config import HumanEvalSettings
from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores
from evalkit.errors import DataError
from evalkit.sandbox import extract_code, run_tests
from evalkit.suites.base import ScoreContext
from evalkit.suites.code import HumanEvalSuite, load_humaneval, score_code_item

REPO = Path(__file__).resolve().parents[1]
HUMANEVAL = SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz"

TASKS = [
    {"task_id": "T/0", "prompt": "def add(a: int, b: int) -> int:\n    \"\"\"a + b\"\"\"\n",
     "canonical_solution": "    return a + b\n", "entry_point": "add",
     "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"},
    {"task_id": "T/1", "prompt": "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n",
     "canonical_solution": "    return sum(xs)\n", "entry_point": "total",
     "test": "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n    assert candidate([]) == 0\n"},
    {"task_id": "T/2", "prompt": "def neg(x: int) -> int:\n    \"\"\"-x\"\"\"\n",
     "canonical_solution": "    return -x\n", "entry_point": "neg",
     "test": "def check(candidate):\n    assert candidate(3) == -3\n"},
]


def _write(path: Path, rows: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _suite(tmp_path: Path, limit: int | None = None, rows: list[Any] = TASKS) -> HumanEvalSuite:
    data = _write(tmp_path / "he.jsonl.gz", rows)
    return HumanEvalSuite(HumanEvalSettings(path=str(data), limit=limit, timeout_s=5), None, tmp_path / "config.yaml")


def _ctx(deps: list[str], ref: str) -> ScoreContext:
    return ScoreContext(deployments=deps, reference=ref, config=None, config_file=Path("config.yaml"), manifest={})


def _rec(task: dict[str, Any], output: str, with_tests: bool = True) -> dict[str, Any]:
    rec = {"suite": "humaneval", "item_id": task["task_id"], "category": "code", "prompt": task["prompt"],
           "prompt_token_ids": [1, 2], "output_text": output, "output_token_ids": [3], "finish_reason": "stop",
           "ttft_s": 0.1, "total_s": 0.2}
    if with_tests:
        rec.update(entry_point=task["entry_point"], test=task["test"])
    return rec


# -- loading --

def test_loader_reads_plain_and_gzip(tmp_path: Path):
    for name in ("he.jsonl", "he.jsonl.gz"):
        items = load_humaneval(_write(tmp_path / name, TASKS))
        assert [i.item_id for i in items] == ["T/0", "T/1", "T/2"]
        assert items[1].category == "code" and items[1].data["entry_point"] == "total"
        assert items[1].data["canonical_solution"] == "    return sum(xs)\n"


def test_loader_malformed_line_names_file_and_line(tmp_path: Path):
    path = _write(tmp_path / "bad.jsonl", [TASKS[0], "", '{"task_id": "T/9", "prompt": ', TASKS[1]])
    with pytest.raises(DataError) as e:
        load_humaneval(path)
    assert str(path) in str(e.value) and "line 3" in str(e.value)
    missing = {k: v for k, v in TASKS[1].items() if k != "test"}
    with pytest.raises(DataError, match=r"line 2: missing or empty field 'test'"):
        load_humaneval(_write(tmp_path / "missing.jsonl", [TASKS[0], missing]))
    with pytest.raises(DataError, match="line 2: duplicate task_id"):
        load_humaneval(_write(tmp_path / "dup.jsonl", [TASKS[0], TASKS[0]]))
    with pytest.raises(DataError, match="file not found"):
        load_humaneval(tmp_path / "nope.jsonl")


def test_limit_takes_the_first_items(tmp_path: Path):
    assert [i.item_id for i in _suite(tmp_path, limit=2).items()] == ["T/0", "T/1"]


# -- the real HumanEval file --

@pytest.mark.shared
def test_real_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    if not HUMANEVAL.exists():
        unavailable("shared HumanEval", f"{HUMANEVAL} not present")
    items = load_humaneval(HUMANEVAL)
    assert len(items) == 164 and items[0].item_id == "HumanEval/0"
    for it in items[:10]:
        d = it.data
        code = extract_code(d["canonical_solution"], prompt=d["prompt"], entry_point=d["entry_point"])
        r = run_tests(code, d["test"], d["entry_point"], timeout_s=10)
        assert r.passed, (it.item_id, r)
    d = items[0].data
    for bad in ("", "    return None\n"):
        r = run_tests(extract_code(bad, prompt=d["prompt"], entry_point=d["entry_point"]), d["test"], d["entry_point"])
        assert not r.passed and r.status == "failed", r


# -- scoring from records --

def test_scores_comparison_and_item_rows_from_records(tmp_path: Path):
    suite = _suite(tmp_path)
    t0, t1, t2 = TASKS
    records = {
        "ref": [_rec(t0, t0["canonical_solution"]), _rec(t1, t1["canonical_solution"]), _rec(t2, "    return x\n")],
        # a chat-style full function, a wrong body, and a fix of the reference's miss (and no tests stored)
        "q4": [_rec(t0, "```python\ndef add(a, b):\n    return a + b\n```"), _rec(t1, "    return 0\n"),
               _rec(t2, "    return -x\n", with_tests=False)],
    }
    ctx = _ctx(["ref", "q4"], "ref")
    scores = {r.deployment: r for r in suite.score(records, ctx)}
    assert scores["ref"].metric == "pass@1" and scores["ref"].value == pytest.approx(2 / 3) and scores["ref"].n == 3
    assert scores["q4"].value == pytest.approx(2 / 3)
    assert 0 < scores["ref"].ci_low < 2 / 3 < scores["ref"].ci_high < 1

    comp = {r.metric: r for r in suite.compare(records, ctx)}
    main = comp["pass@1"]
    assert (main.deployment, main.reference, main.n) == ("q4", "ref", 3)
    assert main.diff == pytest.approx(0.0) and main.p_value == pytest.approx(1.0) and not main.significant
    assert comp["flips_right_to_wrong"].value == pytest.approx(1 / 3)
    assert comp["flips_wrong_to_right"].value == pytest.approx(1 / 3)
    assert comp["flip_rate"].value == pytest.approx(2 / 3)

    rows = {(r["deployment"], r["item_id"]): r for r in suite.item_rows(records, ctx)}
    assert rows[("q4", "T/1")]["flip"] == "right->wrong" and rows[("q4", "T/1")]["status"] == "failed"
    assert rows[("q4", "T/2")]["flip"] == "wrong->right" and rows[("q4", "T/2")]["passed"] is True
    assert rows[("ref", "T/0")]["flip"] == "" and "AssertionError" in rows[("ref", "T/2")]["detail"]


class _ScriptedEngine(Engine):
    """Answers each prompt with a fixed completion (for the request/record plumbing only)."""

    name = "scripted"

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.requests: list[GenRequest] = []

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        for r in requests:
            self.requests.append(r)
            yield GenResult(r.key, [1, 2], self.answers[r.key], [3, 4], "completion", "stop", 0.01, 0.02)

    def info(self) -> EngineInfo:
        raise NotImplementedError

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        raise NotImplementedError

    def detokenize(self, token_ids: Sequence[int]) -> str:
        raise NotImplementedError

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        raise NotImplementedError

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        raise NotImplementedError

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        raise NotImplementedError


def test_run_emits_completion_records_that_score(tmp_path: Path):
    suite = _suite(tmp_path)
    items = suite.items()
    engine = _ScriptedEngine({t["task_id"]: t["canonical_solution"] for t in TASKS})
    batches: list[list[dict[str, Any]]] = []
    suite.run(engine, items, SamplingParams(max_tokens=64), batches.append)
    recs = [r for b in batches for r in b]
    assert all(not r.chat for r in engine.requests) and engine.requests[0].prompt == TASKS[0]["prompt"]
    assert [r["item_id"] for r in recs] == ["T/0", "T/1", "T/2"]
    assert recs[0]["category"] == "code" and recs[0]["generation"]["output_text"] == "    return a + b\n"
    assert "prompt_token_ids" in recs[0] and {"output_token_ids", "finish_reason", "ttft_s", "total_s"} <= set(recs[0]["generation"])
    json.dumps(recs)  # records are JSON lines
    assert [r.value for r in suite.score({"d": recs}, _ctx(["d"], "d"))] == [1.0]


# -- prompts-suite code items --

def test_score_code_item_runs_chat_answers():
    item = {"entry_point": "gcd", "tests": "assert gcd(12, 18) == 6\nassert gcd(0, 0) == 0\n"}
    good = "Here you go:\n\n```python\ndef gcd(a: int, b: int) -> int:\n    while b:\n        a, b = b, a % b\n    return a\n```"
    assert score_code_item(good, item, timeout_s=5) == {"passed": True, "status": "passed", "detail": ""}
    bad = score_code_item("def gcd(a, b):\n    return 1\n", item, timeout_s=5)
    assert bad["passed"] is False and bad["status"] == "failed" and "gcd(12, 18) == 6" in bad["detail"]


@pytest.mark.skipif(not (REPO / "prompts" / "code.jsonl").exists(), reason="prompts/code.jsonl not present")
def test_shipped_code_prompts_canonical_solutions_pass():
    items = [json.loads(line) for line in (REPO / "prompts" / "code.jsonl").read_text().splitlines() if line.strip()]
    for it in items:
        if it.get("canonical_solution"):
            res = score_code_item(f"```python\n{it['canonical_solution']}```", it, timeout_s=10)
            assert res["passed"], (it["id"], res)
