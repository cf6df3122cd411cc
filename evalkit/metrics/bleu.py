"""BLEU and chrF through sacrebleu, with signatures, bootstrap intervals and paired tests.

The resampling reuses sacrebleu's own sufficient statistics so every resampled score is exactly what
sacrebleu would print for that subset (the same machinery as sacrebleu's --paired-bs). The resampling and
the significance rule are evalkit.metrics.stats's, shared with every other suite.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from evalkit.metrics.stats import StatsSettings, CorpusDiff, corpus_bootstrap_ci, corpus_paired_bootstrap

if TYPE_CHECKING:
    from sacrebleu.metrics import BLEU, CHRF


def metrics_for(target_lang: str) -> dict[str, BLEU | CHRF]:
    """BLEU with the tokenizer sacrebleu recommends for the target language (zh for Chinese), and chrF."""
    from sacrebleu.metrics import BLEU, CHRF  # on first use: the prompts suite imports this module in every process

    return {"bleu": BLEU(trg_lang=target_lang), "chrf": CHRF()}


def signatures(target_lang: str) -> dict[str, str]:
    """Reproducibility signatures of the metrics used for `target_lang`."""
    out = {}
    for name, metric in metrics_for(target_lang).items():
        metric.corpus_score(["a"], [["a"]])  # sacrebleu fills nrefs into the signature on first use
        out[name] = str(metric.get_signature())
    return out


@dataclass(frozen=True)
class CorpusScore:
    metric: str
    score: float
    ci_low: float | None
    ci_high: float | None
    n: int
    signature: str


def _item_stats(metric: BLEU | CHRF, hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Per-segment sufficient statistics (n-gram matches, lengths): sums of them give corpus scores."""
    return np.array(metric._extract_corpus_statistics(list(hyps), [list(refs)]), dtype=float)


def _scorer(metric: BLEU | CHRF) -> Callable[[np.ndarray], float]:
    # sacrebleu's own score-from-statistics: every resampled score is what sacrebleu prints for that subset.
    return lambda summed: float(metric._compute_score_from_stats([int(round(x)) for x in summed]).score)


def corpus_scores(hyps: Sequence[str], refs: Sequence[str], target_lang: str,
                  settings: StatsSettings | None = None) -> list[CorpusScore]:
    """Corpus BLEU and chrF of one system with a (1 - alpha) bootstrap interval over segments."""
    out = []
    for name, metric in metrics_for(target_lang).items():
        score = metric.corpus_score(list(hyps), [list(refs)])
        lo, hi = corpus_bootstrap_ci(_item_stats(metric, hyps, refs), _scorer(metric), settings)
        out.append(CorpusScore(name, float(score.score), lo, hi, len(hyps), str(metric.get_signature())))
    return out


def paired_comparison(baseline_hyps: Sequence[str], system_hyps: Sequence[str], refs: Sequence[str],
                      target_lang: str, settings: StatsSettings | None = None) -> dict[str, CorpusDiff]:
    """System minus baseline on the same segments: paired item bootstrap (evalkit.metrics.stats)."""
    out: dict[str, CorpusDiff] = {}
    for name, metric in metrics_for(target_lang).items():
        res = corpus_paired_bootstrap(_item_stats(metric, system_hyps, refs), _item_stats(metric, baseline_hyps, refs),
                                      _scorer(metric), settings)
        # sacrebleu's corpus_score is the reference value; the statistics route must agree with it.
        b = float(metric.corpus_score(list(baseline_hyps), [list(refs)]).score)
        s = float(metric.corpus_score(list(system_hyps), [list(refs)]).score)
        out[name] = replace(res, reference_value=b, value=s, diff=s - b)
    return out
