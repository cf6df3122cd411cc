"""A model judge's answers as a suite: scored from the run directory's `judge/` records (written by `evalkit judge`
or by a run whose config has a `judge:` block) and the imported human ratings that certify it, never planned or run
as a suite (`SuiteSpec.runs` False). The judging itself is evalkit.judge; certified categories only reach the
decision: uncertified ones are declared without a better direction, so no margin can name them."""
from __future__ import annotations

from evalkit.metrics.declarations import MetricSpec
from evalkit.suites.base import NoSettings, RunDirSuite
from evalkit.suites.spec import SuiteSpec

NAME = "judge"


class JudgeSuite(RunDirSuite):
    name = NAME


SPEC = SuiteSpec(
    name=NAME,
    settings_model=NoSettings,
    suite_class=JudgeSuite,
    records=(),
    metrics=(
        MetricSpec(NAME, "score", "points (1-5)", "higher", "continuous", "rating", "paired_bootstrap",
                   "certified judge's mean pointwise score; paired by item against the reference"),
        MetricSpec(NAME, "score_uncertified", "points (1-5)", "none", "continuous", "rating", "none",
                   "judge's mean pointwise score in a category where it is not certified (never in the decision)"),
        MetricSpec(NAME, "net_preference", "win - loss", "higher", "continuous", "num", "none",
                   "certified judge, side by side with the reference in both orders (a flip is a tie)"),
        MetricSpec(NAME, "net_preference_uncertified", "win - loss", "none", "continuous", "num", "none",
                   "side by side, judge not certified in this category (never in the decision)"),
        MetricSpec(NAME, "unparseable", "answers", "none", "count", "count", "none", "judge answers not in the asked format"),
        MetricSpec(NAME, "flip_rate", "share", "lower", "rate", "pct", "none", "pairwise verdicts that change when A and B swap"),
        MetricSpec(NAME, "self_agreement", "share", "higher", "rate", "pct", "none", "outputs given the same score twice"),
        MetricSpec(NAME, "alpha_vs_humans", "alpha", "higher", "continuous", "num", "none",
                   "ordinal Krippendorff's alpha, judge score against each human rating of the same output"),
        MetricSpec(NAME, "length_slope_pointwise", "points / 10 words", "none", "continuous", "num", "none",
                   "judge score per 10 more words of answer"),
        MetricSpec(NAME, "length_slope_pairwise", "outcome / 10 words", "none", "continuous", "num", "none",
                   "pairwise outcome per 10 words longer than the reference's"),
    ),
    title="Model judge",
    report="evalkit.suites.report.judge:section",
    runs=False,
    rows="evalkit.judge.score:tidy_rows",
)
