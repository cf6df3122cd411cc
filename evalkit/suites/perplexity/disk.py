"""The perplexity suite's disk need (SuiteSpec.disk), from the config alone: its records, the per-token side files
each deployment's role gets, the exact-KLD reference's stored distributions (at most a window of chunks in
streaming mode) and what the result cache keeps of them. Tokens are estimated at BYTES_PER_TOKEN text bytes (a
conservative figure for BPE tokenizers on English: WikiText-2 is ~4.4 bytes per SmolLM2 token); the vocabulary is
read from the model's header or config.json (nothing loaded)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.engines import gives_full_distributions
from evalkit.suites.perplexity.chunking import BYTES_PER_TOKEN, chunk_count
from evalkit.suites.perplexity.records import token_dtype
from evalkit.suites.perplexity.reference import bound_deployments, kld_reference, streaming_readers
from evalkit.suites.perplexity.stores import store_bytes_upper_bound
from evalkit.suites.perplexity.suite import PerplexitySuite
from evalkit.suites.spec import DiskNeed

RECORD_BYTES = 1000  # a v2 perplexity records line is < 1 KB
CACHE_ENTRY_BYTES = 1000  # one result-cache entry's JSON envelope (scalars + the side file's hash)
NPY_HEADER = 128


def model_vocab(config: Any, config_file: Path, name: str) -> int | None:
    """The deployment's vocabulary from its model's header or config.json, without loading it (None: unknown)."""
    from evalkit.weights import gguf_weights, hf_weights, local_model_path

    dep = config.deployment(name)
    try:
        path = local_model_path(dep.model.source, config_file)
        return (hf_weights(path) if path.is_dir() else gguf_weights(path)).arch.vocab if path is not None else None
    except Exception:  # an unreadable model is the ledger's row to report
        return None


def disk_need(suite: PerplexitySuite, config: Any, config_file: Path, runs: list[str], use_cache: bool) -> DiskNeed:
    """What the suite writes for the deployments `runs` (a noise-floor re-run is "<name>.rerun")."""
    need = DiskNeed()
    s = suite.settings
    n_bytes = len(suite.text_bytes())
    chunks = min(len(suite.items()), chunk_count(int(n_bytes / BYTES_PER_TOKEN) + 2, s.n_ctx, s.max_chunks))
    per_chunk = s.n_ctx - s.first_scored()
    owner = kld_reference(config) if streaming_readers(config) else None  # no reader: nothing stored
    bound = set(bound_deployments(config))
    for n in runs:
        base = n.removesuffix(".rerun")
        dep = config.deployment(base)
        top_k = suite.top_k_for(n, full=gives_full_distributions(dep.engine))
        if n == owner:
            fields = ["token", "nll", "argmax"]
        elif owner is not None and gives_full_distributions(dep.engine) and n not in bound:
            fields = ["token", "nll", "kld", "same_top"]
        else:
            fields = ["token", "nll"]
        row = token_dtype(fields + (["top_ids", "top_lp"] if top_k else []), top_k, model_vocab(config, config_file, base))
        side = chunks * (per_chunk * row.itemsize + NPY_HEADER)
        need.records += chunks * RECORD_BYTES
        need.side_files += side
        need.cache += (chunks * CACHE_ENTRY_BYTES + side) if use_cache else 0
    if owner is not None and owner in runs:
        vocab = model_vocab(config, config_file, owner)
        if vocab:
            need.distributions_per_chunk = store_bytes_upper_bound(per_chunk, vocab)
            need.distributions_full = chunks * need.distributions_per_chunk
            need.window = s.kld_window
            need.window_setting = f"suites.{suite.name}.kld_window"
            need.distributions = need.distributions_per_chunk * min(chunks, s.kld_window or chunks)
            if use_cache and not s.kld_window:  # the cache keeps each reference chunk's store too
                need.cache += need.distributions_full
        else:
            need.notes.append(f"the size of {owner}'s stored distributions is unknown (its vocabulary is)")
    need.notes.append(f"{suite.name}: ~{chunks:,} chunks x {len(runs)} deployments (tokens estimated at "
                      f"{BYTES_PER_TOKEN:g} text bytes each)")
    return need
