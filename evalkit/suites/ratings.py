"""Imported human ratings as a suite: scored from the run directory's imported sheets (`evalkit rate import`),
never planned or run (`SuiteSpec.runs` False). The rating itself (sheets, import, aggregation) is evalkit.rating;
the suite whose outputs are rated is the one whose spec says `rated_outputs`."""
from __future__ import annotations

from evalkit.metrics.declarations import MetricSpec
from evalkit.suites.base import NoSettings, RunDirSuite
from evalkit.suites.spec import SuiteSpec

NAME = "ratings"


class RatingsSuite(RunDirSuite):
    name = NAME


SPEC = SuiteSpec(
    name=NAME,
    settings_model=NoSettings,
    suite_class=RatingsSuite,
    records=(),
    metrics=(
        MetricSpec(NAME, "rating", "points (1-5)", "higher", "continuous", "rating", "paired_bootstrap",
                   "mean blind rating; item-bootstrap interval"),
        MetricSpec(NAME, "win_rate", "share", "higher", "rate", "pct", "none", "pairwise: deployment preferred"),
        MetricSpec(NAME, "tie_rate", "share", "none", "rate", "pct", "none", "pairwise: no preference"),
        MetricSpec(NAME, "loss_rate", "share", "lower", "rate", "pct", "none", "pairwise: reference preferred"),
        MetricSpec(NAME, "net_preference", "win - loss", "higher", "continuous", "num", "none",
                   "pairwise: mean of win = 1, tie = 0, loss = -1; item-bootstrap interval"),
        MetricSpec(NAME, "krippendorff_alpha", "alpha", "higher", "continuous", "num", "none",
                   "inter-rater agreement (ordinal Krippendorff's alpha)"),
        MetricSpec(NAME, "krippendorff_alpha_pairwise", "alpha", "higher", "continuous", "num", "none",
                   "inter-rater agreement on side-by-side choices (ordinal, loss < tie < win)"),
    ),
    title="Human ratings",
    report="evalkit.suites.report.ratings:section",
    verdict="evalkit.suites.report.ratings:verdict_columns",
    runs=False,
    rows="evalkit.rating.aggregate:tidy_rows",
)
