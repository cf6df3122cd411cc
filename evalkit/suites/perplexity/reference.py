"""Who measures exact KLD against whom: the KLD reference, its readers, and the deployments left with the top-k bound."""
from __future__ import annotations

from typing import Any

from evalkit.engines import gives_full_distributions
from evalkit.suites.perplexity.chunking import REQUIRES


def kld_reference(config: Any) -> str | None:
    """The deployment whose full distributions a run's exact KLD is measured against: `suites.perplexity.
    kld_reference`, else the run's reference; None when that one gives no full distributions (vLLM) or does
    not run perplexity, so there is no exact KLD in the run (only the top-k bound)."""
    from evalkit.engines import engine_spec

    settings = config.suites.perplexity
    if settings is None:
        return None
    name = settings.kld_reference or config.reference
    dep = config.deployment(name)
    spec = engine_spec(dep.engine)
    if not gives_full_distributions(dep.engine) or spec.missing(REQUIRES) or not dep.runs("perplexity"):
        return None
    return name


def streaming_readers(config: Any) -> list[str]:
    """The deployments that read the KLD reference's stored distributions (exact KLD)."""
    owner = kld_reference(config)
    if owner is None:
        return []
    out = [d.name for d in config.deployments
           if d.runs("perplexity") and d.name != owner and gives_full_distributions(d.engine)]
    if config.noise_floor and config.reference in out:
        out.append(config.reference + ".rerun")
    return out


def bound_deployments(config: Any) -> list[str]:
    """Deployments (not the reference) whose KLD is the top-k bound against the run's reference: they give
    no full distributions, or the run has no exact-KLD reference. Their top-k and the reference's are kept."""
    owner = kld_reference(config)
    out = [d.name for d in config.deployments
           if d.runs("perplexity") and d.name != config.reference and (owner is None or not gives_full_distributions(d.engine))]
    if config.noise_floor and (owner is None or not gives_full_distributions(config.deployment(config.reference).engine)):
        out.append(config.reference + ".rerun")
    return out
