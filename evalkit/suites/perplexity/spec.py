"""The perplexity suite's declaration (evalkit/suites/spec.py): metrics, plan-time checks, viewer cells, SPEC."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from evalkit.config import resolve_data_path
from evalkit.engines import gives_full_distributions
from evalkit.errors import ConfigError, DataError
from evalkit.metrics.declarations import MetricSpec
from evalkit.suites.perplexity.records import PerplexityRecord, token_arrays
from evalkit.suites.base import Suite
from evalkit.suites.perplexity.disk import disk_need
from evalkit.suites.perplexity.plan import plan_store_note
from evalkit.suites.perplexity.suite import PerplexitySettings, PerplexitySuite
from evalkit.suites.spec import ItemCell, SuiteSpec, ViewerSpec

METRICS = (
    MetricSpec("perplexity", "ppl", "perplexity", "lower", "continuous", "num", "paired_bootstrap", "exp(mean NLL) over scored tokens"),
    MetricSpec("perplexity", "nll_mean", "nats/token", "lower", "continuous", "num", "none"),
    MetricSpec("perplexity", "bits_per_byte", "bits/byte", "lower", "continuous", "num", "paired_bootstrap"),
    MetricSpec("perplexity", "n_tokens", "tokens", "none", "count", "count", "none"),
    MetricSpec("perplexity", "n_bytes", "bytes", "none", "count", "count", "none"),
    MetricSpec("perplexity", "kld", "nats/token", "lower", "continuous", "kld", "none", "mean KL(ref||dep); its value is the difference"),
    MetricSpec("perplexity", "kld_mean", "nats/token", "lower", "continuous", "kld", "none"),
    # llama.cpp's KLD block: max, percentiles 99.9 .. 0.1 (kld_p99_9 = 99.9%), median, min.
    *[MetricSpec("perplexity", f"kld_{q}", "nats/token", "lower", "continuous", "kld", "none", f"{q} of per-token KLD")
      for q in ("max", "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0_1", "min")],
    MetricSpec("perplexity", "kld_exact", "flag", "none", "count", "count", "none",
       "1: KLD exact over the full vocabulary; 0: top-k + tail lower bound"),
    MetricSpec("perplexity", "kld_bound_bias", "share", "none", "continuous", "pct", "none",
       "how far the top-k + tail bound at the run's top_k reads below the exact mean KLD (1 - bound/exact)"),
    MetricSpec("perplexity", "kld_same_weights_exact", "nats/token", "none", "continuous", "kld", "none",
       "a bound deployment's weights: the exact mean KLD another engine measured on them in the same run"),
    MetricSpec("perplexity", "kld_bound_reads_below", "share", "none", "continuous", "pct", "none",
       "how far a bound deployment's KLD reads below the exact value measured on the same weights (1 - bound/exact)"),
    MetricSpec("perplexity", "top1_agreement", "share", "higher", "rate", "pct", "none", "both argmaxes agree"),
    MetricSpec("perplexity", "delta_p_mean", "probability", "none", "continuous", "num", "none", "p_dep - p_ref of the correct token"),
    MetricSpec("perplexity", "delta_p_rms", "probability", "lower", "continuous", "kld", "none"),
    # llama.cpp's token probability block: Δp max, percentiles 99.9 .. 0.1, median, min.
    *[MetricSpec("perplexity", f"delta_p_{q}", "probability", "none", "continuous", "num", "none", f"{q} of per-token Δp")
      for q in ("max", "p99_9", "p99", "p95", "p90", "p75", "median", "p25", "p10", "p5", "p1", "p0_1", "min")],
    MetricSpec("perplexity", "ppl_diff", "perplexity", "lower", "continuous", "num", "none", "PPL(dep) - PPL(ref), paired ±"),
    MetricSpec("perplexity", "nll_correlation", "correlation", "higher", "continuous", "num", "none",
       "Cor(ln PPL(dep), ln PPL(ref)) of the per-token NLLs, as llama.cpp"),
    MetricSpec("perplexity", "ppl_ratio", "ratio", "lower", "continuous", "num", "none", "PPL(dep) / PPL(ref)"),
    MetricSpec("perplexity", "ln_ppl_ratio", "nats/token", "lower", "continuous", "num", "none"),
    # Drift by position (category "pos 0-512", "pos 512-1K", ...: the predicted token's index in its chunk).
    MetricSpec("perplexity", "pos_kld", "nats/token", "lower", "continuous", "kld", "none", "mean KL(ref||dep) in the position bucket"),
    MetricSpec("perplexity", "pos_top1_agreement", "share", "higher", "rate", "pct", "none", "both argmaxes agree, in the position bucket"),
    MetricSpec("perplexity", "pos_nll_diff", "nats/token", "lower", "continuous", "num", "none",
       "mean NLL(dep) - NLL(ref) in the position bucket"),
    MetricSpec("perplexity", "top1_below_from", "tokens", "none", "continuous", "num", "none",
       "start of the first position bucket where top-1 agreement falls below the threshold (NaN: none)"),
    # kv_reference: against the same weights with a 16-bit KV cache (the KV cache's own effect).
    MetricSpec("perplexity", "kv_kld", "nats/token", "lower", "continuous", "kld", "none",
       "mean KL(16-bit KV||this KV), same weights (top-k + tail bound)"),
    MetricSpec("perplexity", "kv_top1_agreement", "share", "higher", "rate", "pct", "none",
       "argmax agrees with the same weights' 16-bit KV cache"),
    MetricSpec("perplexity", "kv_pos_kld", "nats/token", "lower", "continuous", "kld", "none",
       "KLD against the same weights' 16-bit KV cache, in the position bucket"),
    MetricSpec("perplexity", "kv_pos_top1_agreement", "share", "higher", "rate", "pct", "none",
       "argmax agrees with the same weights' 16-bit KV cache, in the position bucket"),
    MetricSpec("perplexity", "kv_top1_below_from", "tokens", "none", "continuous", "num", "none",
       "first position bucket where agreement with the same weights' 16-bit KV cache falls below the threshold"),
)


def _check_kld_reference(settings: PerplexitySettings, config: Any) -> None:
    """`suites.perplexity.kld_reference` names a deployment that gives full distributions and runs perplexity."""
    name = settings.kld_reference
    if name is None:
        return
    names = [d.name for d in config.deployments]
    where = "suites.perplexity.kld_reference"
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        raise ValueError(f"{where}: {name!r} is not a deployment name" + (f" (did you mean {close[0]!r}?)" if close else ""))
    dep = config.deployment(name)
    if not gives_full_distributions(dep.engine):
        full = [d.name for d in config.deployments if gives_full_distributions(d.engine)]
        hint = f" (deployments that do: {', '.join(full)})" if full else ""
        raise ValueError(f"{where}: {name} runs on engine {dep.engine}, which gives no full next-token "
                         f"distributions, so exact KLD cannot be measured against it{hint}")
    if not dep.runs("perplexity"):
        raise ValueError(f"{where}: {name} does not run the perplexity suite (its suites: list)")


def _check_plan(suite: Suite[Any], items: list[Any], config: Any, config_file: Path) -> None:
    """The text fills at least one chunk, and no deployment's context is shorter than a chunk."""
    n_ctx = suite.settings.n_ctx
    if not items:
        # A token covers at least one byte (+2 for BOS and a space prefix): fewer bytes can't fill one chunk.
        path = resolve_data_path(suite.settings.text, suite.config_file)
        raise DataError(str(path), f"perplexity text is too short for one chunk of n_ctx={n_ctx} tokens")
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        if not dep.runs(suite.name):
            continue
        spec = engine_spec(dep.engine)
        limits = spec.limits_of(dep)  # a running server's own context, read from it
        context = limits.get("n_ctx") or spec.context_of(dep.options)
        where = limits.get("n_ctx_from") if limits.get("n_ctx") else f"options.{spec.context_option}"
        if context and n_ctx > context:
            raise ConfigError(
                str(config_file),
                f"suites.perplexity.n_ctx={n_ctx} exceeds deployment {dep.name}'s context ({context} tokens, {where})",
            )


def _viewer_cell(rec: PerplexityRecord) -> ItemCell:
    if rec.skipped:
        return ItemCell(f"skipped: {rec.skipped}", None, -1, prompt="(past the end of the text)")
    # Token ids come from token_arrays (suites.perplexity.records) on the item page (the scored tokens; v2 keeps them in a side file).
    return ItemCell("", None, -1, {"n_ctx": rec.n_ctx}, prompt=f"(perplexity chunk {rec.chunk_index}: {rec.n_ctx} tokens of the text)")


def _token_ids(rec: PerplexityRecord, run_dir: Path) -> Any:
    """The scored token ids of a chunk (records v2: from its side file; v1: inline)."""
    if not rec.scored:
        return None
    arrays = token_arrays(rec, run_dir)
    return arrays["token"] if "token" in (arrays.dtype.names or ()) else None


def _arrays(rec: Any, run_dir: Path, where: str) -> Any:
    """A scored chunk's per-token arrays (a numpy structured array, fields among records.TOKEN_FIELDS) from its side
    file (v2) or its inline lists (v1); None for a skipped chunk."""
    if not isinstance(rec, PerplexityRecord) or not rec.scored:
        return None
    return token_arrays(rec, run_dir, where)


def _workload(settings: PerplexitySettings) -> dict[str, int]:
    """Logit rows one decode returns: the scored second half of each chunk (llama-perplexity's rule), and vLLM's
    prompt log-probabilities over the whole chunk."""
    n_ctx = int(settings.n_ctx)
    return {"scored_rows": n_ctx - n_ctx // 2, "prompt_logprob_rows": n_ctx}


# What the KLD settings can change: the distribution-drift figures, measured against the KLD reference with the
# reference's top-k ids (where KLD is the top-k bound). NLL, perplexity and their ratios read each side's own
# log-likelihood of the text, which neither setting touches: runs differing only there stay comparable on those.
_DRIFT = frozenset(m.name for m in METRICS if m.name.startswith(("kld", "delta_p", "top1", "pos_kld", "pos_top1")))

SPEC = SuiteSpec(
    name="perplexity",
    settings_model=PerplexitySettings,
    suite_class=PerplexitySuite,
    records=(PerplexityRecord,),
    metrics=METRICS,
    title="Perplexity and distribution drift",
    report="evalkit.suites.report.perplexity:section",
    verdict="evalkit.suites.report.perplexity:verdict_columns",
    viewer=ViewerSpec(cell=_viewer_cell, word_diff=False, token_ids=_token_ids, value_metric="ppl",
                      figures=(("ppl", "ppl", "{:.4g}"), ("kld_mean", "KLD", "{:.3g}"), ("top1_agreement", "top-1", "{:.1%}"),
                               ("bits_per_byte", "bpb", "{:.4g}"))),
    check=_check_plan,
    config_check=_check_kld_reference,
    plan_note=plan_store_note,
    workload=_workload,
    n_unit="scored tokens",
    disk=disk_need,
    arrays=_arrays,
    metric_settings={
        "top_k": _DRIFT,
        "kld_reference": _DRIFT | {"pos_nll_diff"},  # the position curves are drawn against the KLD reference
        "kld_window": frozenset(),  # how many stored chunks wait on disk: no figure changes
        "top1_threshold": frozenset({"top1_below_from"}),  # only where the headline bucket is drawn
    },
)
