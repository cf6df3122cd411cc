"""The plan's lines on exact KLD, before anything runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.engines import gives_full_distributions
from evalkit.suites.perplexity.chunking import BYTES_PER_TOKEN, REQUIRES, chunk_count
from evalkit.suites.perplexity.reference import kld_reference
from evalkit.suites.perplexity.scoring import bound_looseness
from evalkit.suites.perplexity.stores import store_bytes_upper_bound
from evalkit.suites.perplexity.suite import PerplexitySuite


def answers_perplexity(dep: Any) -> bool:
    """Whether the deployment runs perplexity at all (its suites: list, and its engine's or server's log-probs)."""
    from evalkit.engines import engine_spec

    return dep.runs("perplexity") and all(c in engine_spec(dep.engine).capabilities_of(dep)[0] for c in REQUIRES)


def served_top_k_lines(config: Any, top_k: int) -> list[str]:
    """A line per served deployment whose server gives fewer top-k log-probs than suites.perplexity.top_k: its
    PPL is unchanged (the actual token's log-prob), its KLD bound is at the server's k, looser."""
    from evalkit.engines import engine_spec

    out = []
    for dep in config.deployments:
        if not answers_perplexity(dep):
            continue
        limits = engine_spec(dep.engine).limits_of(dep)
        k = limits.get("top_k")
        if k is not None and k < top_k:
            bound = f"its KLD is the top-{k} + tail bound ({bound_looseness(k)})" if k else "no KLD for it"
            out.append(f"perplexity: {dep.name}'s server gives at most top-{k} log-probs per token ({limits.get('top_k_from')}): "
                       f"{bound}; its PPL reads the actual token's log-prob, as in-process")
    return out


def plan_store_note(config: Any, config_file: Path) -> str | None:
    """The plan's lines on exact KLD, before anything runs: which deployments get it, against whose stored
    distributions and how large that store can get; which keep the top-k bound. None: perplexity is off."""
    from evalkit.weights import gguf_weights, hf_weights, local_model_path

    s = config.suites.perplexity
    if s is None:
        return None
    owner = kld_reference(config)
    limited = served_top_k_lines(config, s.top_k)
    if owner is None:
        ref = config.deployment(config.reference)
        return "\n".join([f"perplexity: no exact KLD (the reference {ref.name} runs on {ref.engine}, which gives no full "
                          f"distributions, and no suites.perplexity.kld_reference is set); KLD is the top-{s.top_k} + tail "
                          "lower bound", *limited])
    ref = config.deployment(owner)
    runs = [d for d in config.deployments if answers_perplexity(d) and d.name != owner]
    readers = [d.name for d in runs if gives_full_distributions(d.engine)]
    bound = [d.name for d in runs if not gives_full_distributions(d.engine) and d.name != config.reference]
    lines = [f"perplexity: exact KLD against {owner} for {', '.join(readers) or 'no deployment'}"]
    if bound:  # engines without full distributions keep the bound, against the run's reference
        lines.append(f"perplexity: top-{s.top_k} + tail lower bound of KLD against {config.reference} for {', '.join(bound)}")
    lines += limited
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
