"""The CPUs this process may run on: its affinity mask (a container's or taskset's limit), not the host's count.
Below everything that sizes threads by it (hardware, the engines, the quantizer)."""
from __future__ import annotations

import os


def core_ids() -> list[int]:
    """The CPU numbers this process may run on, ascending (0..n-1 where the platform has no affinity mask)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPUs this process may run on."""
    return len(core_ids())
