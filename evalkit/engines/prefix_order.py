"""Which prompts of a batch an engine with a block prefix cache (vLLM) should prefill first, so the others find
their shared prefix in the cache instead of computing it again.

Why: requests that arrive together are scheduled together, and a request looks the prefix cache up when it is
first scheduled, before the requests beside it have written anything there. The long-context suite's prompts of
one length share their filler up to the needle (the plain-filler prompt with every needle prompt, 0.1-0.9 of
it), so all at once they compute about 4 lengths' worth of prompt, and after one leader 2.5 (the same for
the judge's prompts sharing a rubric). Only prefixes of at least `MIN_SHARED` tokens count: below that, holding
requests back costs more than the prefill it saves. The cost suite's prompts differ from their first token
on purpose, so it never gets a leader and measures arrivals as they come.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

MIN_SHARED = 256  # tokens
MAX_BATCH = 256  # larger batches are left in arrival order (the pairwise sums grow as the square)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def prefix_leaders(prompts: Sequence[Sequence[int]], min_shared: int = MIN_SHARED) -> list[int]:
    """Indices (ascending) of the prompts to prefill before the rest: one per group of prompts that share at
    least `min_shared` leading tokens with a neighbour in sorted order (sorted order puts the prompt sharing
    the longest prefix with each prompt next to it), the member sharing the most tokens with the others of
    its group (the earliest on ties). Empty when no two prompts share that much."""
    if not 2 <= len(prompts) <= MAX_BATCH:
        return []
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    groups: list[list[int]] = [[order[0]]]
    for before, i in zip(order, order[1:]):
        if common_prefix(prompts[before], prompts[i]) >= min_shared:
            groups[-1].append(i)
        else:
            groups.append([i])
    leaders = []
    for group in groups:
        if len(group) < 2:
            continue
        shared = {i: sum(common_prefix(prompts[i], prompts[j]) for j in group if j != i) for i in group}
        leaders.append(min(group, key=lambda i: (-shared[i], i)))
    return sorted(leaders)
