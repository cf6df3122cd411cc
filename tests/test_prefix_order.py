"""Which prompts of a batch are prefilled first (evalkit.engines.prefix_order), on token lists built by hand:
the long-context suite's shape (a plain filler prompt and needle prompts cut from it), the cost suite's
(prompts differing from their first token), and two unrelated groups in one batch."""
from __future__ import annotations

from evalkit.engines.prefix_order import MIN_SHARED, common_prefix, prefix_leaders

FILLER = list(range(1000, 3048))  # 2048 distinct tokens
NEEDLE = [7, 8, 9]
QUESTION = [5, 6]


def needle_prompt(length: int, depth: float) -> list[int]:
    body = FILLER[: length - len(NEEDLE) - len(QUESTION)]
    pos = round(depth * len(body))
    return body[:pos] + NEEDLE + body[pos:] + QUESTION


def test_common_prefix_counts_by_hand() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0


def test_the_plain_filler_prompt_leads_its_needle_prompts() -> None:
    """Shared with the others: the filler prompt 0.9 + 0.5 + 0.1 of the body, the 0.9 needle prompt the same
    (a tie, the earlier wins), the 0.5 one 0.5 + 0.5 + 0.1, the 0.1 one 0.3."""
    prompts = [FILLER[:1024], needle_prompt(1024, 0.9), needle_prompt(1024, 0.5), needle_prompt(1024, 0.1)]
    body = 1024 - len(NEEDLE) - len(QUESTION)
    assert common_prefix(prompts[0], prompts[1]) == round(0.9 * body)
    assert prefix_leaders(prompts) == [0]
    assert prefix_leaders(prompts[1:]) == [0]  # without the filler prompt the deepest needle leads


def test_two_groups_get_a_leader_each_and_a_loner_none() -> None:
    other = list(range(5000, 6024))
    prompts = [other[:600] + [1], FILLER[:900], other[:600] + [2], FILLER[:700] + [3], [42] * 300]
    assert prefix_leaders(prompts) == [0, 1]


def test_no_leader_below_the_shared_minimum_or_for_the_cost_suites_prompts() -> None:
    short = [FILLER[: MIN_SHARED - 1] + [1], FILLER[: MIN_SHARED - 1] + [2]]
    assert prefix_leaders(short) == []
    assert prefix_leaders([FILLER[: MIN_SHARED] + [1], FILLER[: MIN_SHARED] + [2]]) == [0]
    cost_like = [[i] + FILLER[:500] for i in range(4)]  # a different first word per request
    assert prefix_leaders(cost_like) == []
    assert prefix_leaders([FILLER]) == []
