"""The judge's prompts and the strict reading of its answers.

Pointwise: the category's rubric, the prompt, the gold answer where the item has one, the answer; the judge
must reply `Score: <1-5>` then `Reason: <text>`. Pairwise: the pairwise rubric and two answers A and B; the
judge must reply `Verdict: A|B|Tie` then `Reason: <text>`. Anything else is unparseable: recorded with the raw
text and counted, never guessed at (a lenient reader would turn a rambling judge into scores).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import DataError
from evalkit.resources import resource_path

# Changing a template changes its hash, which is in the judge's identity (result-cache key and manifest).
POINTWISE_TEMPLATE = """You are grading one answer to a prompt, using the rubric below.

{rubric}

# Prompt
{prompt}
{gold}
# Answer to grade
{answer}

# Your reply
Reply with exactly two lines and nothing else, in this form:
Score: 3
Reason: The answer is partly right."""

PAIRWISE_TEMPLATE = """You are comparing two answers to the same prompt, using the rubric below.

{rubric}

# Prompt
{prompt}
{gold}
# Answer A
{answer_a}

# Answer B
{answer_b}

# Your reply
Reply with exactly two lines and nothing else, in this form (Verdict: A, Verdict: B or Verdict: Tie):
Verdict: Tie
Reason: Both answers are equally good."""

GOLD = "\n# Gold answer (for reference)\n{gold}\n"

_MARK = r"[*_`]*"  # Markdown emphasis around the label or the value is formatting, not content
_SCORE = re.compile(rf"^{_MARK}score{_MARK}\s*:{_MARK}\s*{_MARK}([1-5])(?:\s*/\s*5)?{_MARK}\.?$", re.IGNORECASE)
_VERDICT = re.compile(rf"^{_MARK}verdict{_MARK}\s*:{_MARK}\s*{_MARK}(A|B|tie){_MARK}\.?$", re.IGNORECASE)
_REASON = re.compile(rf"^{_MARK}reason{_MARK}\s*:{_MARK}\s*(.+)$", re.IGNORECASE)
MAX_REASON_CHARS = 500


def template_sha256() -> str:
    """The hash of both templates (part of the judge's identity)."""
    blob = "\x00".join((POINTWISE_TEMPLATE, PAIRWISE_TEMPLATE, GOLD))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def rubric_text(rubrics_dir: Path, name: str) -> str:
    """The rubric file `<rubrics_dir>/<name>.md` (a category's, or `pairwise`); a missing one is the user's error."""
    path = Path(rubrics_dir) / f"{name}.md"
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        raise DataError(str(path), f"no rubric for {name!r} (the judge grades with rubrics/<category>.md)") from None


def rubrics_dir_of(setting: str | None, config_file: Path | None) -> Path:
    """`judge.rubrics` (relative to the config file), or evalkit's own rubrics."""
    if setting is None:
        return Path(resource_path("rubrics"))
    path = Path(setting).expanduser()
    if not path.is_absolute() and config_file is not None:
        path = Path(config_file).parent / path
    return path


def _gold(gold: str | None) -> str:
    return GOLD.format(gold=gold) if gold else ""


def pointwise_prompt(rubric: str, prompt: str, answer: str, gold: str | None) -> str:
    return POINTWISE_TEMPLATE.format(rubric=rubric, prompt=prompt, gold=_gold(gold), answer=answer)


def pairwise_prompt(rubric: str, prompt: str, answer_a: str, answer_b: str, gold: str | None) -> str:
    return PAIRWISE_TEMPLATE.format(rubric=rubric, prompt=prompt, gold=_gold(gold), answer_a=answer_a,
                                    answer_b=answer_b)


@dataclass(frozen=True)
class Parsed:
    """A judge answer read strictly: `value` is the score (1-5) or verdict ("A", "B", "tie"); None when the
    answer does not follow the format (`problem` says how)."""

    value: int | str | None
    reason: str
    problem: str | None = None


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def _read(text: str, pattern: re.Pattern[str], what: str) -> Parsed:
    lines = _lines(text)
    if not lines:
        return Parsed(None, "", "empty answer")
    found = pattern.match(lines[0])
    if found is None:
        return Parsed(None, "", f"first line is not '{what}'")
    reason = _REASON.match(lines[1]) if len(lines) > 1 else None
    if reason is None:
        return Parsed(None, "", "no 'Reason:' line after it")
    if len(lines) > 2:
        return Parsed(None, "", "more than the two lines asked for")
    return Parsed(found.group(1), reason.group(1).strip()[:MAX_REASON_CHARS])


def parse_pointwise(text: str) -> Parsed:
    got = _read(text, _SCORE, "Score: <1-5>")
    return got if got.value is None else Parsed(int(got.value), got.reason)


def parse_pairwise(text: str) -> Parsed:
    got = _read(text, _VERDICT, "Verdict: A|B|Tie")
    if got.value is None:
        return got
    value = str(got.value).upper()
    return Parsed("tie" if value == "TIE" else value, got.reason)
