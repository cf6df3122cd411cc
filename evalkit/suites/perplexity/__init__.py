"""Chunked perplexity exactly as llama.cpp's `llama-perplexity`, and drift (KLD) from the reference.

Chunking (tools/perplexity/perplexity.cpp, `perplexity()`): the whole text is tokenized once with BOS
(one trailing newline dropped, as `-f` does), cut into non-overlapping chunks of n_ctx tokens (the
remainder is dropped), each chunk's first token is replaced by BOS where the model adds one, and
only the tokens at positions n_ctx/2 + 1 .. n_ctx - 1 are scored (the logits at n_ctx/2 .. n_ctx - 2
predict them). PPL = exp(mean NLL over every scored token of every chunk).

Bits per byte = total NLL in bits / UTF-8 bytes of the scored span, where the span's bytes are those of
`engine.detokenize(scored token ids)` (the scored tokens' pieces concatenated; a character split at a
span edge renders as U+FFFD, 3 bytes). It divides by text, not tokens, so tokenizers compare.

Records hold each chunk's tokens, per-token NLLs and the top-k log-probs, so PPL and KLD are computed
from records alone (`evalkit.metrics.likelihood`).

The package, one job a module:
- `chunking`: how the text is cut and which tokens of a chunk are scored.
- `reference`: the KLD reference (whose full distributions exact KLD is measured against), its readers, and
  the deployments left with the top-k bound.
- `stores`: the reference's chunk stores and tokenization in the run directory, and those kept in the cache.
- `streaming`: streaming exact KLD (`kld_window`): the reference and its readers at once, a window of stores.
- `measure`: the engine side, one chunk's measurement and side file, through the result cache
  (`evalkit.cache.cached_measurement`).
- `suite`: `PerplexitySettings` and `PerplexitySuite` (running over the chunks; score, compare, item rows).
- `scoring`: from records only: chunks, their pairing with the reference's, the score and comparison rows.
- `plan`: the plan's lines on exact KLD.
- `spec`: the suite's declaration (`SPEC`, its metrics, plan-time checks and viewer cells).

Everything other modules use is importable from `evalkit.suites.perplexity` itself.
"""
from __future__ import annotations

from evalkit.suites.perplexity.chunking import BYTES_PER_TOKEN, CATEGORY, REQUIRES, chunk_count, chunk_id, scored_from
from evalkit.suites.perplexity.measure import ChunkSpan, distribution_source, score_chunk, score_chunk_full
from evalkit.suites.perplexity.plan import plan_store_note
from evalkit.suites.perplexity.reference import bound_deployments, kld_reference, streaming_readers
from evalkit.suites.perplexity.scoring import same_weights
from evalkit.suites.perplexity.spec import METRICS, SPEC
from evalkit.suites.perplexity.stores import (STORE_DIR, STORE_SUFFIX, reference_tokens_path, store_bytes_upper_bound, store_dir,
                                              write_reference_tokens)
from evalkit.suites.perplexity.streaming import Streaming
from evalkit.suites.perplexity.suite import PerplexitySettings, PerplexitySuite

__all__ = [
    "BYTES_PER_TOKEN", "CATEGORY", "METRICS", "REQUIRES", "SPEC", "STORE_DIR", "STORE_SUFFIX", "ChunkSpan", "PerplexitySettings",
    "PerplexitySuite", "Streaming", "bound_deployments", "chunk_count", "chunk_id", "distribution_source", "kld_reference",
    "plan_store_note", "reference_tokens_path", "same_weights", "score_chunk", "score_chunk_full", "scored_from",
    "store_bytes_upper_bound", "store_dir", "streaming_readers", "write_reference_tokens",
]
