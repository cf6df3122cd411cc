"""`evalkit plan` says, before anything runs, whether the suites' sizes can show the configured margins."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
from scipy import stats as sps

from evalkit.config import load_config
from evalkit.margin_plan import margin_plans


def _no_flip_half_width(n: int, continuity: float = 0.25) -> float:
    """The interval's half-width with no discordant pair, solved by hand (see tests/test_stats.py)."""
    z = float(sps.norm.ppf(0.975))
    qa, qb, qc = n * n + z * z * n, -(2 * n * continuity + z * z * n), continuity**2
    return (-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa)


def test_the_default_configs_mmlu_cannot_show_its_margin_and_the_plan_says_how_many_items_can() -> None:
    config, config_file = load_config(None)
    (plan,) = [p for p in margin_plans(config, config_file) if p.key == "mmlu/accuracy"]
    assert plan.items == 40 and plan.margin == -0.05 and not plan.can_show
    assert plan.best_case_low == pytest.approx(-_no_flip_half_width(40), rel=1e-12)  # bisection vs closed form
    # With no flip the outcome is certain: the needed size is where the no-flip half-width drops below 5 points.
    needed = plan.needed_without_flips
    assert needed is not None and _no_flip_half_width(needed) < 0.05 < _no_flip_half_width(math.floor(needed * 0.97))
    assert plan.needed_with_typical_flips is not None and plan.needed_with_typical_flips > needed
    assert "40 items cannot show a 5-point margin" in plan.line() and f"about {needed:,} are needed" in plan.line()


def test_evalkit_plan_prints_the_margin_line() -> None:
    out = subprocess.run([sys.executable, "-m", "evalkit", "plan"], capture_output=True, text=True, check=True).stdout
    assert any(line.startswith("mmlu/accuracy: 40 items give at best") for line in out.splitlines())
