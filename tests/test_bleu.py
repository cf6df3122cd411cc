"""BLEU/chrF equal the sacrebleu command line on the same files; paired comparison is consistent."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.metrics.bleu import corpus_scores, paired_comparison
from evalkit.metrics.stats import MIN_ITEMS_FOR_CORPUS_INTERVAL
from evalkit.resources import resource_path


def _translation_items(lang: str) -> list[dict]:
    lines = resource_path("prompts/translation.jsonl").read_text(encoding="utf-8").splitlines()
    return [i for i in map(json.loads, lines) if i["target_lang"] == lang]


def _hypotheses(refs: list[str]) -> list[str]:
    """Imperfect system outputs: drop the last word/char of every other reference, reverse one."""
    out = []
    for k, r in enumerate(refs):
        if k % 2:
            out.append(r[: max(1, len(r) - 3)])
        elif k % 3 == 0:
            out.append(r[::-1])
        else:
            out.append(r)
    return out


def _cli_score(ref: Path, hyp: Path, metric: str, lang: str) -> float:
    args = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", metric, "-b", "-w", "6"]
    if metric == "bleu" and lang == "zh":
        args += ["-tok", "zh"]
    return float(subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip())


@pytest.mark.parametrize("lang", ["zh", "de"])
def test_bleu_and_chrf_equal_the_sacrebleu_cli(tmp_path: Path, lang: str) -> None:
    refs = [i["reference"] for i in _translation_items(lang)]
    hyps = _hypotheses(refs)
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    ours = {s.metric: s for s in corpus_scores(hyps, refs, lang)}
    for metric in ("bleu", "chrf"):
        assert ours[metric].score == pytest.approx(_cli_score(tmp_path / "ref.txt", tmp_path / "hyp.txt", metric, lang), abs=1e-4)
        # A handful of segments: no corpus interval is printed (tests/test_coverage.py: 200 items are needed).
        assert len(refs) < MIN_ITEMS_FOR_CORPUS_INTERVAL and ours[metric].ci_low is None and ours[metric].ci_high is None
    assert "tok:zh" in ours["bleu"].signature if lang == "zh" else "tok:13a" in ours["bleu"].signature


def test_paired_comparison_direction_and_significance() -> None:
    segments = [i["reference"] for i in _translation_items("de")]
    refs = (segments * (MIN_ITEMS_FOR_CORPUS_INTERVAL // len(segments) + 1))[:MIN_ITEMS_FOR_CORPUS_INTERVAL]
    good, bad = refs, [r.split()[0] for r in refs]  # the second system keeps one word per segment
    res = paired_comparison(good, bad, refs, "de")
    for p in res.values():
        assert p.diff == pytest.approx(p.value - p.reference_value)
        assert p.diff < 0 and p.ci_high < 0 and p.significant
    same = paired_comparison(good, good, refs, "de")
    assert all(p.diff == 0 and not p.significant for p in same.values())
    few = paired_comparison(good[:10], bad[:10], refs[:10], "de")
    assert all(p.diff < 0 and p.ci_low is None and not p.significant and "too few items" in p.method
               for p in few.values())
