"""The ratings suite in the report (evalkit/suites/ratings.py): imported blind human ratings, after the section of
the suite whose outputs were rated (SuiteSpec.rated_outputs)."""
from __future__ import annotations

from evalkit.report import plots as P
from evalkit.report import tables as T
from evalkit.report.render import Section, some
from evalkit.report.view import RunView


def section(view: RunView) -> Section | None:
    if not view.human:
        return None
    return Section("human", "Human ratings", "Blind ratings imported from the rating sheets, de-blinded with the run's key.",
                   T.human_tables(view), some(P.human_plot(view)))
