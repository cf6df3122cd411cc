"""Before anything runs: can the configured suite sizes show the configured margins at all?

`evalkit plan` prints one line per pass/fail margin (accuracy, pass@1, recall): the items the suite will have,
the interval those items give when the deployment flips no answer at all (the best case), and the items the
paired interval (evalkit.metrics.stats, Tango's score interval) needs to show the margin with 80% power, with
no flip and with flips both ways at a typical quantized rate. The figures come from the same sample-size
computation the report uses for an inconclusive verdict, so plan and report agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.metrics.declarations import MarginKey, metric_spec
from evalkit.metrics.stats import pass_fail_items_needed, paired_proportion_interval

# A per-direction flip rate that quantized deployments commonly show on multiple-choice items (a few percent of
# answers change, both ways): the second figure of each line, so the best case is not the only one shown.
TYPICAL_FLIP_RATE = 0.025
_RATE_BASE = 100_000  # items at which the typical rate is given to the sample-size computation as counts


@dataclass(frozen=True)
class MarginPlan:
    key: str
    margin: float
    items: int
    best_case_low: float  # lower end of the interval with no flip at `items`
    needed_without_flips: int | None
    needed_with_typical_flips: int | None

    @property
    def can_show(self) -> bool:
        return self.best_case_low > self.margin

    def line(self) -> str:
        def pts(x: float) -> str:
            return f"{100 * abs(x):.3g}"

        head = (f"{self.key}: {self.items} items give at best ±{pts(self.best_case_low)} points (no answer "
                f"flipped); the margin is {pts(self.margin)} points")
        if self.can_show:
            verdict = "they can show it if few answers flip"
        else:
            verdict = f"{self.items} items cannot show a {pts(self.margin)}-point margin"
        need = [f"about {n:,} are needed with no flip" for n in [self.needed_without_flips] if n]
        need += [f"about {n:,} with {100 * TYPICAL_FLIP_RATE:g}% of answers flipping each way"
                 for n in [self.needed_with_typical_flips] if n]
        return f"{head}: {verdict}" + (f"; {', '.join(need)} (80% power)" if need else "")


def margin_plans(config: Any, config_file: Path) -> list[MarginPlan]:
    """One plan per pass/fail difference margin of `decision.margins` whose suite is enabled."""
    from evalkit.suites import enabled_suites

    margins = dict(config.decision.margins) if config.decision is not None else {}
    if not margins:
        return []
    suites = {s.name: s for s in enabled_suites(config, config_file)}
    plans = []
    for key, margin in margins.items():
        mk = MarginKey.parse(key)
        spec = metric_spec(mk.suite, mk.metric)
        if spec is None or spec.paired_test != "mcnemar" or mk.suite not in suites or margin >= 0:
            continue
        items = [i for i in suites[mk.suite].items() if mk.category in (None, "all", i.category)]
        n = len(items)
        if n == 0:
            continue
        low, _ = paired_proportion_interval(0, 0, n)
        flips = round(TYPICAL_FLIP_RATE * _RATE_BASE)
        plans.append(MarginPlan(key, float(margin), n, float(low), pass_fail_items_needed(0, 0, n, margin),
                                pass_fail_items_needed(flips, flips, _RATE_BASE, margin)))
    return plans
