"""The judge suite in the report (evalkit/suites/judge.py): a model judge's grades of the rated suite's outputs,
after the human ratings (evalkit.report.judge_section draws them)."""
from __future__ import annotations

from evalkit.report.judge_section import section_parts
from evalkit.report.render import Section
from evalkit.report.view import RunView


def section(view: RunView) -> Section | None:
    judged = section_parts(view)
    return None if judged is None else Section("judge", "Model judge", judged[0], judged[1])
