"""The plan's lines on exact KLD, before anything runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.engines import gives_full_distributions
from evalkit.suites.perplexity.chunking import BYTES_PER_TOKEN, chunk_count
from evalkit.suites.perplexity.reference import kld_reference
from evalkit.suites.perplexity.stores import store_bytes_upper_bound
from evalkit.suites.perplexity.suite import PerplexitySuite


def plan_store_note(config: Any, config_file: Path) -> str | None:
    """The plan's lines on exact KLD, before anything runs: which deployments get it, against whose stored
    distributions and how large that store can get; which keep the top-k bound. None: perplexity is off."""
    from evalkit.ledger import gguf_weights, hf_weights, local_model_path

    s = config.suites.perplexity
    if s is None:
        return None
    owner = kld_reference(config)
    if owner is None:
        ref = config.deployment(config.reference)
        return (f"perplexity: no exact KLD (the reference {ref.name} runs on {ref.engine}, which gives no full "
                f"distributions, and no suites.perplexity.kld_reference is set); KLD is the top-{s.top_k} + tail lower bound")
    ref = config.deployment(owner)
    runs = [d for d in config.deployments if d.runs("perplexity") and d.name != owner]
    readers = [d.name for d in runs if gives_full_distributions(d.engine)]
    bound = [d.name for d in runs if not gives_full_distributions(d.engine) and d.name != config.reference]
    lines = [f"perplexity: exact KLD against {owner} for {', '.join(readers) or 'no deployment'}"]
    if bound:  # engines without full distributions keep the bound, against the run's reference
        lines.append(f"perplexity: top-{s.top_k} + tail lower bound of KLD against {config.reference} for {', '.join(bound)}")
    suite = PerplexitySuite(s, config, config_file)
    # The same estimate as the disk plan's (evalkit.diskplan): tokens at BYTES_PER_TOKEN text bytes each.
    chunks = min(len(suite.items()), chunk_count(int(len(suite.text_bytes()) / BYTES_PER_TOKEN) + 2, s.n_ctx, s.max_chunks))
    tokens = chunks * (s.n_ctx - s.first_scored())
    path = local_model_path(ref.model.source, config_file)
    try:
        vocab = (hf_weights(path) if path.is_dir() else gguf_weights(path)).arch.vocab if path is not None else None
    except Exception:  # an unreadable model is the ledger's row to report, not this line's
        vocab = None
    if not vocab:
        lines.append(f"perplexity: {owner}'s store size is unknown (vocabulary of {ref.model.source} unknown)")
    else:
        most = store_bytes_upper_bound(tokens, vocab)
        window = f"; streaming (kld_window: {s.kld_window}): at most {s.kld_window} chunks of it at a time" if s.kld_window else ""
        lines.append(f"perplexity: {owner}'s stored distributions: ~{most / 1e9:.2f} GB in the run directory "
                     f"(~{tokens:,} scored tokens x {vocab:,} ids, 2 bytes each at most, as llama.cpp's base file; "
                     f"long-tailed distributions take less{window})")
    return "\n".join(lines)
