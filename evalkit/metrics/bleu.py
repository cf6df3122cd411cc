"""BLEU and chrF through sacrebleu, with signatures, bootstrap intervals and paired tests.

The resampling reuses sacrebleu's own sufficient statistics so every resampled score is exactly what
sacrebleu would print for that subset (the same machinery as sacrebleu's --paired-bs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

N_BOOTSTRAP = 1000


def metrics_for(target_lang: str) -> dict[str, BLEU | CHRF]:
    """BLEU with the tokenizer sacrebleu recommends for the target language (zh for Chinese), and chrF."""
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
    ci_low: float
    ci_high: float
    n: int
    signature: str


def _resampled_scores(metric: BLEU | CHRF, stats: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.array([metric._compute_score_from_stats(list(stats[i].sum(axis=0))).score for i in idx])


def _bootstrap_indices(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(N_BOOTSTRAP, n))


def corpus_scores(hyps: Sequence[str], refs: Sequence[str], target_lang: str, seed: int = 12345) -> list[CorpusScore]:
    """Corpus BLEU and chrF of one system with a 95% bootstrap interval over segments."""
    out = []
    idx = _bootstrap_indices(len(hyps), seed)
    for name, metric in metrics_for(target_lang).items():
        score = metric.corpus_score(list(hyps), [list(refs)])
        stats = np.array(metric._extract_corpus_statistics(list(hyps), [list(refs)]))
        boots = _resampled_scores(metric, stats, idx)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        out.append(CorpusScore(name, float(score.score), float(lo), float(hi), len(hyps), str(metric.get_signature())))
    return out


@dataclass(frozen=True)
class PairedScore:
    metric: str
    baseline: float
    system: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    p_value: float
    n: int

    @property
    def significant(self) -> bool:
        """The bootstrap interval of the difference excludes zero. (sacrebleu's AR p-value is reported
        beside it, but on a handful of segments it is not trustworthy: it can print 0.001 for n = 2.)"""
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 0 or self.ci_high < 0)


def _opt(x: float | None) -> float | None:
    return None if x is None else float(x)


def paired_comparison(
    baseline_hyps: Sequence[str], system_hyps: Sequence[str], refs: Sequence[str], target_lang: str, seed: int = 12345
) -> list[PairedScore]:
    """System minus baseline on the same segments: paired bootstrap CI of the difference, and
    sacrebleu's paired approximate-randomization p-value."""
    out = []
    idx = _bootstrap_indices(len(refs), seed)
    metrics = metrics_for(target_lang)
    ar = PairedTest(
        [("baseline", list(baseline_hyps)), ("system", list(system_hyps))],
        metrics=metrics,
        references=[list(refs)],
        test_type="ar",
        n_samples=N_BOOTSTRAP,
    )
    _, results = ar()
    results_by_metric = dict(zip(metrics, list(results.values())[1:]))  # keys are display names (BLEU, chrF2)
    for name, metric in metrics.items():
        b_stats = np.array(metric._extract_corpus_statistics(list(baseline_hyps), [list(refs)]))
        s_stats = np.array(metric._extract_corpus_statistics(list(system_hyps), [list(refs)]))
        diffs = _resampled_scores(metric, s_stats, idx) - _resampled_scores(metric, b_stats, idx)
        b = metric.corpus_score(list(baseline_hyps), [list(refs)]).score
        s = metric.corpus_score(list(system_hyps), [list(refs)]).score
        lo, hi = np.percentile(diffs, [2.5, 97.5]) if len(refs) >= 2 else (None, None)  # no interval from one segment
        p = results_by_metric[name][1].p_value
        out.append(PairedScore(name, float(b), float(s), float(s - b), _opt(lo), _opt(hi), float(p if p is not None else 1.0), len(refs)))
    return out
