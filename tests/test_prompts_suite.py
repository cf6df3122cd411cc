"""The shipped prompt set, prompt-file errors, answer matching."""
from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.errors import DataError
from evalkit.resources import resource_path
from evalkit.suites.prompts import contains_answer, exact_match, load_prompts, normalize_answer


def test_shipped_prompt_set_has_every_category() -> None:
    items = load_prompts(resource_path("prompts"))
    by_cat: dict[str, int] = {}
    for item in items:
        by_cat[item.category] = by_cat.get(item.category, 0) + 1
    assert set(by_cat) == {"code", "reasoning", "translation", "qa"}
    assert min(by_cat.values()) >= 12
    langs = {i.target_lang for i in items if i.category == "translation"}
    assert {"zh", "de"} <= langs


def test_malformed_prompt_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"id": "q1", "category": "qa", "prompt": "2+2?", "answers": ["4"]}\n{"id": "q2", "category": "qa"\n')
    with pytest.raises(DataError) as err:
        load_prompts(f)
    assert f"{f}:2" in str(err.value) and "not valid JSON" in str(err.value)
    f.write_text('{"id": "q1", "category": "qa", "prompt": "2+2?"}\n')
    with pytest.raises(DataError, match=r"mine.jsonl:1: .*needs field\(s\) answers"):
        load_prompts(f)
    f.write_text('{"id": "q1", "category": "poetry", "prompt": "x"}\n')
    with pytest.raises(DataError, match=r"mine.jsonl:1: category"):
        load_prompts(f)


def test_duplicate_ids_rejected(tmp_path: Path) -> None:
    line = '{"id": "q1", "category": "qa", "prompt": "2+2?", "answers": ["4"]}\n'
    (tmp_path / "a.jsonl").write_text(line)
    (tmp_path / "b.jsonl").write_text(line)
    with pytest.raises(DataError, match="duplicate item id 'q1'"):
        load_prompts(tmp_path)


def test_answer_matching() -> None:
    assert normalize_answer("  The Eiffel Tower!  ") == "eiffel tower"
    assert exact_match("Paris.", ["paris"])
    assert not exact_match("It is Paris.", ["paris"])
    assert contains_answer("It is Paris.", ["paris"])
    assert contains_answer("The answer is 42", ["42"])
    assert not contains_answer("The answer is 420", ["42"])  # whole words only
    # A final "Answer:" line is what counts: numbers in the working do not.
    assert exact_match("3 + 4 = 7, then 7 * 2 = 14.\nAnswer: 14", ["14"])
    assert not contains_answer("We have 7 apples and 14 pears.\nAnswer: 7", ["14"])
