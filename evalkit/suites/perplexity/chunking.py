"""How llama.cpp's `llama-perplexity` cuts a text into chunks and which tokens of a chunk it scores."""
from __future__ import annotations

from evalkit.engines.spec import Capability

CATEGORY = "text"
# What the suite needs of an engine (PerplexitySuite.requires; kld_reference checks the KLD reference has it).
REQUIRES = frozenset({Capability.PROMPT_LOGPROBS, Capability.TOKENIZER})


LOGPROB_DECIMALS = 6  # top-k log-probs in records: 1e-6 is below float32 logit noise, halves the size


# Text bytes per token assumed where a plan must size a run before any tokenizer is loaded: conservative for BPE
# tokenizers on English (WikiText-2 is ~4.4 bytes per SmolLM2 token).
BYTES_PER_TOKEN = 3.0


def scored_from(n_ctx: int, positions: str = "second_half") -> int:
    """Index in a chunk of the first scored token (llama.cpp: logits from `first = n_ctx/2` on; "all": every token
    after the first, for drift by position from the start of the context)."""
    return 1 if positions == "all" else n_ctx // 2 + 1


def chunk_count(n_tokens: int, n_ctx: int, max_chunks: int | None) -> int:
    n = n_tokens // n_ctx
    return n if max_chunks is None else min(n, max_chunks)


def chunk_id(index: int) -> str:
    return f"chunk-{index:04d}"
