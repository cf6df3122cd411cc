"""Every metric evalkit emits, declared once: unit, direction, kind, display format and paired test.

The report, verdict and plots read these declarations (never a metric's name) to decide which way is
better and how to show a number; tests fail on a metric that a suite emits but nobody declared.

Names ending in "*" declare a family whose members differ only by a suffix (e.g. "bleu_en-*" covers
"bleu_en-zh" and "bleu_en-de"); an exact declaration wins over a family.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower", "none"]
Kind = Literal["rate", "continuous", "count"]
PairedTest = Literal["mcnemar", "paired_bootstrap", "corpus_bootstrap", "none"]
# Display formats understood by evalkit.report.cells: pct (a share shown in %), score (0-100 points),
# rating (1-5 scale), num (magnitude-dependent digits), kld (two significant digits), ms (seconds shown
# in ms), s (seconds), mb (values in MiB, shown as MB/GB of 10^6/10^9 bytes), count (integer).
Fmt = Literal["pct", "score", "rating", "num", "kld", "ms", "s", "mb", "count"]


@dataclass(frozen=True)
class MetricSpec:
    suite: str
    name: str
    unit: str
    direction: Direction
    kind: Kind
    fmt: Fmt
    paired_test: PairedTest
    description: str = ""

    @property
    def better(self) -> int:
        """+1 when higher is better, -1 when lower is, 0 when neither."""
        return {"higher": 1, "lower": -1, "none": 0}[self.direction]


_m = MetricSpec  # the table below passes MetricSpec's fields by position, one declaration a line


_FLIPS = [
    ("flip_rate", "lower", "share of items whose correctness changed against the reference"),
    ("flips_right_to_wrong", "lower", "share of items the reference got right and the deployment wrong"),
    ("flips_wrong_to_right", "higher", "share of items the reference got wrong and the deployment right"),
]

_DECLARED: list[MetricSpec] = [
    # -- prompts ---------------------------------------------------------------------------------
    _m("prompts", "pass@1", "share", "higher", "rate", "pct", "mcnemar", "code items whose tests pass"),
    _m("prompts", "exact_match", "share", "higher", "rate", "pct", "mcnemar", "normalized final answer equals a gold answer"),
    _m("prompts", "contains", "share", "higher", "rate", "pct", "mcnemar", "a gold answer appears in the final answer"),
    _m("prompts", "bleu_en-*", "BLEU points", "higher", "continuous", "score", "corpus_bootstrap", "corpus BLEU (sacrebleu)"),
    _m("prompts", "chrf_en-*", "chrF points", "higher", "continuous", "score", "corpus_bootstrap", "corpus chrF (sacrebleu)"),
    _m("prompts", "output_tokens_mean", "tokens", "none", "continuous", "num", "none", "mean generated tokens per item"),
    # -- perplexity ------------------------------------------------------------------------------
    _m("perplexity", "ppl", "perplexity", "lower", "continuous", "num", "paired_bootstrap", "exp(mean NLL) over scored tokens"),
    _m("perplexity", "nll_mean", "nats/token", "lower", "continuous", "num", "none"),
    _m("perplexity", "bits_per_byte", "bits/byte", "lower", "continuous", "num", "paired_bootstrap"),
    _m("perplexity", "n_tokens", "tokens", "none", "count", "count", "none"),
    _m("perplexity", "n_bytes", "bytes", "none", "count", "count", "none"),
    _m("perplexity", "kld", "nats/token", "lower", "continuous", "kld", "none", "mean KL(ref||dep); its value is the difference"),
    _m("perplexity", "kld_mean", "nats/token", "lower", "continuous", "kld", "none"),
    # llama.cpp's KLD block: max, percentiles 99.9 .. 0.1 (kld_p99_9 = 99.9%), median, min.
    *[_m("perplexity", f"kld_{q}", "nats/token", "lower", "continuous", "kld", "none", f"{q} of per-token KLD")
      for q in ("max", "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0_1", "min")],
    _m("perplexity", "kld_exact", "flag", "none", "count", "count", "none",
       "1: KLD exact over the full vocabulary; 0: top-k + tail lower bound"),
    _m("perplexity", "kld_bound_bias", "share", "none", "continuous", "pct", "none",
       "how far the top-k + tail bound at the run's top_k reads below the exact mean KLD (1 - bound/exact)"),
    _m("perplexity", "kld_same_weights_exact", "nats/token", "none", "continuous", "kld", "none",
       "a bound deployment's weights: the exact mean KLD another engine measured on them in the same run"),
    _m("perplexity", "kld_bound_reads_below", "share", "none", "continuous", "pct", "none",
       "how far a bound deployment's KLD reads below the exact value measured on the same weights (1 - bound/exact)"),
    _m("perplexity", "top1_agreement", "share", "higher", "rate", "pct", "none", "both argmaxes agree"),
    _m("perplexity", "delta_p_mean", "probability", "none", "continuous", "num", "none", "p_dep - p_ref of the correct token"),
    _m("perplexity", "delta_p_rms", "probability", "lower", "continuous", "kld", "none"),
    # llama.cpp's token probability block: Δp max, percentiles 99.9 .. 0.1, median, min.
    *[_m("perplexity", f"delta_p_{q}", "probability", "none", "continuous", "num", "none", f"{q} of per-token Δp")
      for q in ("max", "p99_9", "p99", "p95", "p90", "p75", "median", "p25", "p10", "p5", "p1", "p0_1", "min")],
    _m("perplexity", "ppl_diff", "perplexity", "lower", "continuous", "num", "none", "PPL(dep) - PPL(ref), paired ±"),
    _m("perplexity", "nll_correlation", "correlation", "higher", "continuous", "num", "none",
       "Cor(ln PPL(dep), ln PPL(ref)) of the per-token NLLs, as llama.cpp"),
    _m("perplexity", "ppl_ratio", "ratio", "lower", "continuous", "num", "none", "PPL(dep) / PPL(ref)"),
    _m("perplexity", "ln_ppl_ratio", "nats/token", "lower", "continuous", "num", "none"),
    # -- mmlu ------------------------------------------------------------------------------------
    _m("mmlu", "accuracy", "share", "higher", "rate", "pct", "mcnemar"),
    *[_m("mmlu", n, "share", d, "rate", "pct", "mcnemar", t) for n, d, t in _FLIPS],  # type: ignore[arg-type]
    _m("mmlu", "four_continuation_items", "items", "none", "count", "count", "none",
       "questions scored by four continuations (letters not single tokens)"),
    # -- longcontext -----------------------------------------------------------------------------
    _m("longcontext", "recall_accuracy", "share", "higher", "rate", "pct", "mcnemar", "pass key recalled"),
    *[_m("longcontext", f"seq_rep_{n}", "share", "lower", "continuous", "pct", "paired_bootstrap", f"repeated word {n}-grams")
      for n in (2, 3, 4)],
    _m("longcontext", "distinct_2", "share", "higher", "continuous", "pct", "paired_bootstrap", "distinct word 2-grams"),
    _m("longcontext", "skipped_items", "items", "none", "count", "count", "none", "items that did not fit the context"),
    # -- humaneval -------------------------------------------------------------------------------
    _m("humaneval", "pass@1", "share", "higher", "rate", "pct", "mcnemar"),
    *[_m("humaneval", n, "share", d, "rate", "pct", "mcnemar", t) for n, d, t in _FLIPS],  # type: ignore[arg-type]
    # -- cost ------------------------------------------------------------------------------------
    _m("cost", "tokens_per_s", "tokens/s", "higher", "continuous", "num", "none", "total output tokens / wall time"),
    _m("cost", "per_request_tokens_per_s", "tokens/s", "higher", "continuous", "num", "none"),
    _m("cost", "latency_median_s", "s", "lower", "continuous", "s", "none"),
    _m("cost", "latency_p90_s", "s", "lower", "continuous", "s", "none"),
    _m("cost", "ttft_median_s", "s", "lower", "continuous", "ms", "none"),
    _m("cost", "ttft_p90_s", "s", "lower", "continuous", "ms", "none"),
    _m("cost", "itl_median_s", "s", "lower", "continuous", "ms", "none", "inter-token latency: (last - first token time) / (tokens - 1), per request"),
    _m("cost", "itl_p90_s", "s", "lower", "continuous", "ms", "none"),
    _m("cost", "server_peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "high-water RSS of the server evalkit started"),
    _m("cost", "output_tokens_mean", "tokens", "none", "continuous", "num", "none"),
    _m("cost", "peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "process tree RSS sampled during the level"),
    _m("cost", "worker_peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "process tree high-water RSS since the worker started"),
    _m("cost", "peak_gpu_mem_mb", "MiB", "lower", "continuous", "mb", "none"),
    _m("cost", "power_w", "W", "lower", "continuous", "num", "none"),
    _m("cost", "decode_tokens_per_s", "tokens/s", "higher", "continuous", "num", "none",
       "per request, after its first token: (output tokens - 1) / (latency - time to first token), median"),
    _m("cost", "bandwidth_bound_share", "ratio", "higher", "continuous", "num", "none",
       "decode tokens/s per request / (memory bandwidth / weight bytes read per token)"),
    _m("cost", "memory_bandwidth_gb_s", "GB/s", "none", "continuous", "num", "none",
       "GPU: the table's datasheet figure (evalkit/gpus.py); CPU: measured (numpy copy, bytes read + written)"),
    _m("cost", "weights_gb", "GB", "none", "continuous", "num", "none", "weight bytes read per decoded token"),
    _m("cost", "max_temp_c", "°C", "none", "continuous", "num", "none"),
    _m("cost", "startup_s", "s", "lower", "continuous", "s", "none", "engine load time"),
    # -- ratings (imported human ratings) --------------------------------------------------------
    _m("ratings", "rating", "points (1-5)", "higher", "continuous", "rating", "paired_bootstrap",
       "mean blind rating; item-bootstrap interval"),
    _m("ratings", "win_rate", "share", "higher", "rate", "pct", "none", "pairwise: deployment preferred"),
    _m("ratings", "tie_rate", "share", "none", "rate", "pct", "none", "pairwise: no preference"),
    _m("ratings", "loss_rate", "share", "lower", "rate", "pct", "none", "pairwise: reference preferred"),
    _m("ratings", "net_preference", "win - loss", "higher", "continuous", "num", "none",
       "pairwise: mean of win = 1, tie = 0, loss = -1; item-bootstrap interval"),
    _m("ratings", "krippendorff_alpha", "alpha", "higher", "continuous", "num", "none",
       "inter-rater agreement (ordinal Krippendorff's alpha)"),
    _m("ratings", "krippendorff_alpha_pairwise", "alpha", "higher", "continuous", "num", "none",
       "inter-rater agreement on side-by-side choices (ordinal, loss < tie < win)"),
]


def _index(specs: list[MetricSpec]) -> tuple[dict[tuple[str, str], MetricSpec], list[MetricSpec]]:
    exact: dict[tuple[str, str], MetricSpec] = {}
    families: list[MetricSpec] = []
    for s in specs:
        if s.name.endswith("*"):
            families.append(s)
        elif (s.suite, s.name) in exact:
            raise ValueError(f"metric {s.suite}/{s.name} declared twice")
        else:
            exact[(s.suite, s.name)] = s
    return exact, families


_EXACT, _FAMILIES = _index(_DECLARED)


def metric_spec(suite: str, name: str) -> MetricSpec | None:
    """The declaration of `name` in `suite` (a family member matches its family), or None."""
    found = _EXACT.get((suite, name))
    if found is not None:
        return found
    for fam in _FAMILIES:
        if fam.suite == suite and name.startswith(fam.name[:-1]) and len(name) > len(fam.name) - 1:
            return fam
    return None


def require_spec(suite: str, name: str) -> MetricSpec:
    """metric_spec, but an undeclared metric is a programming error (raised, naming it)."""
    found = metric_spec(suite, name)
    if found is None:
        raise KeyError(f"metric {suite}/{name} is not declared in evalkit/metrics/declarations.py")
    return found


def all_metrics() -> list[MetricSpec]:
    return list(_DECLARED)


# -- margin keys (`decision.margins`): checked here, against the declarations, by config and decision ------

COST_SUITE = "cost"  # its metrics are limits under decision.workload, never quality margins


@dataclass(frozen=True)
class MarginKey:
    suite: str
    category: str | None  # None: the suite's overall category ("all", or the only one there is)
    metric: str

    @classmethod
    def parse(cls, key: str) -> "MarginKey":
        parts = key.split("/")
        if len(parts) == 2 and all(parts):
            return cls(parts[0], None, parts[1])
        if len(parts) == 3 and all(parts):
            return cls(parts[0], parts[1], parts[2])
        raise ValueError(f"margin key {key!r}: expected 'suite/metric' or 'suite/category/metric'")


def direction_of(suite: str, metric: str) -> str | None:
    """The declared direction ("higher" / "lower" / "none") of a metric, None when undeclared."""
    spec = metric_spec(suite, metric)
    return spec.direction if spec else None


def check_margin_key(key: str) -> MarginKey:
    """A margin key that names a declared metric with a better direction; ValueError (one line) otherwise."""
    mk = MarginKey.parse(key)
    if mk.suite == COST_SUITE:
        raise ValueError(f"margin {key!r}: cost is not a quality margin; state limits under decision.workload "
                         "(max_ttft_ms, min_tokens_per_s)")
    direction = direction_of(mk.suite, mk.metric)
    if direction is None:
        names = sorted(f"{m.suite}/{m.name}" for m in all_metrics() if m.suite != COST_SUITE and m.direction != "none")
        close = difflib.get_close_matches(f"{mk.suite}/{mk.metric}", names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"margin {key!r}: unknown metric {mk.suite}/{mk.metric}{hint}")
    if direction not in ("higher", "lower"):
        raise ValueError(f"margin {key!r}: {mk.suite}/{mk.metric} has no better direction, so no loss to bound")
    return mk
