"""Long-context tasks beyond one needle, after RULER's task families (Hsieh et al. 2024, "RULER: What's the Real
Context Size of Your Long-Context Language Models?", sections 3.1-3.3):

- `multikey`: several key/value needles in the filler; asked for one key's value (distractor keys).
- `multivalue`: one key with several values spread through the filler; asked for all of them.
- `vartrack`: a chain of variable assignments (VAR A = 12345, VAR B = VAR A, ...) spread through the filler;
  asked for every variable that holds the value (multi-hop tracing).
- `commonwords`: a numbered word list where a few words appear many times and the rest rarely; asked for the
  most common ones (aggregation), after a filler prefix that brings it to the length.

Every item is generated from (seed, task, length, sample) alone, with its own numpy Generator, so adding a
length or a task never changes another item. Prompts are token-exact: the pieces are tokenized separately with
the deployment's tokenizer and the filler is cut so that prompt + generation budget = the target length.
Values are 7-digit numbers and names are pseudo-words (consonant-vowel syllables), chosen so that none occurs in
the filler text and all are distinct: each answer appears exactly once in the haystack (commonwords: its count is
the point). Scoring is exact: an answer counts when it appears as a whole word in the output; an item is
correct when every answer does (RULER's string match, all-or-nothing per item).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

TASKS = ("multikey", "multivalue", "vartrack", "commonwords")
# Tokens the answer may take (generation budget, counted inside the length), per task.
BUDGET = {"multikey": 16, "multivalue": 48, "vartrack": 32, "commonwords": 48}
N_KEYS = 4  # multikey: needles (one asked, three distractors)
N_VALUES = 4  # multivalue: values of the asked key
N_HOPS = 5  # vartrack: variables in the chain
N_COMMON, COMMON_FREQ, RARE_FREQ = 5, 8, 2  # commonwords: 5 words x 8, the rest x 2 (two-syllable words)
COMMON_LIST_SHARE = 0.6  # commonwords: at most this share of the prompt is the word list (the rest filler)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class TaskItem:
    """The parts of one task item: needle sentences (in order), the question, the answers and, for
    commonwords, the word list (needles empty then)."""

    task: str
    needles: tuple[str, ...]
    question: str
    answers: tuple[str, ...]
    word_list: tuple[str, ...] = field(default=())


def _rng(seed: int, task: str, length: int, sample: int) -> np.random.Generator:
    return np.random.default_rng([seed, TASKS.index(task) + 1, length, sample])


def _word(rng: np.random.Generator, syllables: int = 3) -> str:
    return "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(syllables))


def _word2(rng: np.random.Generator) -> str:
    return _word(rng, 2)


def _fresh(rng: np.random.Generator, make: Callable[[np.random.Generator], str], n: int, avoid: str, taken: set[str]) -> list[str]:
    """n distinct strings from `make`, none in the filler text (as a whole word) and none already taken."""
    out: list[str] = []
    while len(out) < n:
        s = make(rng)
        if s in taken or re.search(rf"\b{re.escape(s)}\b", avoid, flags=re.IGNORECASE):
            continue
        taken.add(s)
        out.append(s)
    return out


def _number(rng: np.random.Generator) -> str:
    return str(int(rng.integers(1_000_000, 10_000_000)))


def make_item(task: str, seed: int, length: int, sample: int, filler_text: str) -> TaskItem:
    rng = _rng(seed, task, length, sample)
    taken: set[str] = set()
    if task == "multikey":
        keys = _fresh(rng, _word, N_KEYS, filler_text, taken)
        values = _fresh(rng, _number, N_KEYS, filler_text, taken)
        asked = int(rng.integers(N_KEYS))
        needles = tuple(f" One of the special magic numbers for {k} is: {v}. " for k, v in zip(keys, values))
        q = (f"\n\nWhat is the special magic number for {keys[asked]} mentioned in the provided text? "
             f"The special magic number for {keys[asked]} mentioned in the provided text is")
        return TaskItem(task, needles, q, (values[asked],))
    if task == "multivalue":
        (key,) = _fresh(rng, _word, 1, filler_text, taken)
        values = _fresh(rng, _number, N_VALUES, filler_text, taken)
        needles = tuple(f" One of the special magic numbers for {key} is: {v}. " for v in values)
        q = (f"\n\nWhat are all the special magic numbers for {key} mentioned in the provided text? "
             f"The special magic numbers for {key} mentioned in the provided text are")
        return TaskItem(task, needles, q, tuple(values))
    if task == "vartrack":
        names = [n.upper() for n in _fresh(rng, lambda r: _word(r, 2) + _CONSONANTS[r.integers(len(_CONSONANTS))], N_HOPS, filler_text, taken)]
        (value,) = _fresh(rng, _number, 1, filler_text, taken)
        needles = (f" VAR {names[0]} = {value}. ", *(f" VAR {b} = VAR {a}. " for a, b in zip(names, names[1:])))
        q = (f"\n\nFind all variables that are assigned the value {value} in the text above. Answer: According to "
             f"the chain(s) of variable assignment in the text above, {N_HOPS} variables are assigned the value "
             f"{value}, they are:")
        return TaskItem(task, needles, q, tuple(names))
    if task == "commonwords":
        common = _fresh(rng, _word2, N_COMMON, filler_text, taken)
        return TaskItem(task, (), "", tuple(common), word_list=tuple(common))  # the list is sized in build_prompt
    raise ValueError(f"unknown long-context task {task!r}")


def _cw_lines(rng: np.random.Generator, common: Sequence[str], rare: Sequence[str]) -> list[str]:
    words = [w for w in common for _ in range(COMMON_FREQ)] + [w for w in rare for _ in range(RARE_FREQ)]
    order = rng.permutation(len(words))
    return [f"{i + 1}. {words[j]}\n" for i, j in enumerate(order)]


CW_INTRO = ("\n\nBelow is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n")
CW_QUESTION = (f"Question: What are the {N_COMMON} most common words in the above list? "
               f"Answer: The top {N_COMMON} words that appear most often in the list are:")


@dataclass(frozen=True)
class BuiltPrompt:
    ids: list[int]
    needle_positions: tuple[int, ...]  # token index where each needle starts (commonwords: the list)
    answers: tuple[str, ...]
    skipped: str | None = None


def build_prompt(item: TaskItem, length: int, seed: int, sample: int, bos: list[int], filler: list[int],
                 tokenize: Tokenize, filler_text: str) -> BuiltPrompt:
    """The item's prompt in exactly `length - BUDGET[task]` tokens: BOS, filler with the needles at evenly
    spread depths drawn from the item's generator (in needle order), the question."""
    target = length - BUDGET[item.task]
    if item.task == "commonwords":
        return _build_cw(item, target, seed, sample, bos, filler, tokenize, filler_text)
    rng = np.random.default_rng([seed, TASKS.index(item.task) + 1, length, sample, 1])
    needles = [tokenize(n) for n in item.needles]
    question = tokenize(item.question)
    room = target - len(bos) - sum(map(len, needles)) - len(question)
    if room <= 0:
        return BuiltPrompt([], (), item.answers, f"length {length} leaves no room for filler around the needles")
    # depths: sorted uniform draws in (0.05, 0.95), as RULER spreads its needles
    cuts = sorted(int(round(d * room)) for d in rng.uniform(0.05, 0.95, size=len(needles)))
    ids, positions, prev = list(bos), [], 0
    for cut, needle in zip(cuts, needles):
        ids += filler[prev:cut]
        positions.append(len(ids))
        ids += needle
        prev = cut
    ids += filler[prev:room] + question
    return BuiltPrompt(ids, tuple(positions), item.answers)


def _build_cw(item: TaskItem, target: int, seed: int, sample: int, bos: list[int], filler: list[int],
              tokenize: Tokenize, filler_text: str) -> BuiltPrompt:
    rng = np.random.default_rng([seed, TASKS.index("commonwords") + 1, target, sample, 1])
    intro, question = tokenize(CW_INTRO), tokenize("\n" + CW_QUESTION)
    list_room = int(COMMON_LIST_SHARE * target) - len(intro) - len(question)
    common = list(item.word_list)
    taken = set(common)
    # the most rare words whose shuffled list fits its share of the prompt (binary search over a long enough
    # candidate list; each list is shuffled by its own generator, so the result depends on the count alone)
    n_pool = max(1, list_room // RARE_FREQ)
    pool = _fresh(rng, _word2 if n_pool < 2000 else _word, n_pool, filler_text, taken)  # 4,900 two-syllable words

    def body_of(n: int) -> list[int]:
        return tokenize("".join(_cw_lines(np.random.default_rng([seed, sample, n]), common, pool[:n])))

    if len(body_of(1)) > list_room:
        return BuiltPrompt([], (), item.answers, f"length {target + BUDGET['commonwords']} leaves no room for the word list")
    lo, hi = 1, len(pool)  # body_of(lo) fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(body_of(mid)) <= list_room else (lo, mid - 1)
    body = body_of(lo)
    gap = target - len(bos) - len(intro) - len(body) - len(question)
    ids = list(bos) + filler[:gap] + intro + body + question
    return BuiltPrompt(ids, (len(bos) + gap,), item.answers)


def found(answers: Sequence[str], output: str) -> list[bool]:
    """Whether each answer appears as a whole word in the output (case-sensitive: names are upper case)."""
    return [re.search(rf"(?<![\w]){re.escape(a)}(?![\w])", output) is not None for a in answers]
