"""Whole-run progress: how far the run is, its elapsed time and an estimate of the time left.

Each worker shows its own per-suite bar; this adds the run-wide line beside it. The state lives in
`progress.json` in the run directory (the pipeline writes the plan, each worker adds what it finished),
because deployments run in separate processes, one after another or (streaming exact KLD) at once.

The estimate weighs items by how long that suite's items really took in this run (a generated answer
costs ~100x an MMLU item): the same deployment's rate when it has one, else the same suite's rate on
other deployments, else the run's average; then it scales by elapsed / measured time, which folds in
what no item accounts for (engine start-up). Hand-written: tqdm knows one bar, not a run of processes.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from evalkit.store import RunDir, atomic_write_text, lock_path

PROGRESS_FILE = "progress.json"


@dataclass
class RunProgress:
    path: Path
    started: float  # wall clock (epoch seconds): the run's elapsed time spans processes
    plan: dict[str, dict[str, int]]  # deployment -> suite -> items pending when the run (or resume) started
    done: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def start(cls, run_dir: Path, plan: dict[str, dict[str, int]]) -> "RunProgress":
        progress = cls(path=Path(run_dir) / PROGRESS_FILE, started=time.time(), plan=plan)
        progress.save()
        return progress

    @classmethod
    def load(cls, run_dir: Path) -> "RunProgress | None":
        path = Path(run_dir) / PROGRESS_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(path=path, started=float(raw["started"]), plan=raw["plan"], done=raw["done"], seconds=raw["seconds"])
        except (OSError, ValueError, KeyError, TypeError):  # no plan (a worker started by hand): no run line
            return None

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        atomic_write_text(self.path, json.dumps(data, indent=1) + "\n")

    def record(self, deployment: str, suite: str, items: int, seconds: float) -> None:
        """`items` more of (deployment, suite) finished, taking `seconds` of suite time. Workers that run at once
        (a streaming-KLD group) share the file: each adds its own figures to what is on disk, under a lock."""
        with FileLock(lock_path(self.path)):
            on_disk = RunProgress.load(self.path.parent)
            if on_disk is not None:
                self.done, self.seconds = on_disk.done, on_disk.seconds
            self.done.setdefault(deployment, {})[suite] = self.done.get(deployment, {}).get(suite, 0) + items
            self.seconds.setdefault(deployment, {})[suite] = self.seconds.get(deployment, {}).get(suite, 0.0) + seconds
            self.save()

    def _rate(self, deployment: str, suite: str) -> float | None:
        """Seconds per item for (deployment, suite), from what this run measured."""
        n = self.done.get(deployment, {}).get(suite, 0)
        if n:
            return self.seconds[deployment][suite] / n
        same = [(self.seconds[d][suite], self.done[d][suite]) for d in self.done if self.done[d].get(suite)]
        if same:
            return sum(s for s, _ in same) / sum(k for _, k in same)
        total_n = sum(sum(v.values()) for v in self.done.values())
        return sum(sum(v.values()) for v in self.seconds.values()) / total_n if total_n else None

    def remaining_s(self, now: float | None = None) -> float | None:
        measured = sum(sum(v.values()) for v in self.seconds.values())
        if measured <= 0:
            return None
        work = 0.0
        for dep, suites in self.plan.items():
            for suite, planned in suites.items():
                left = max(0, planned - self.done.get(dep, {}).get(suite, 0))
                if left:
                    rate = self._rate(dep, suite)
                    if rate is None:
                        return None
                    work += left * rate
        elapsed = (now or time.time()) - self.started
        return work * max(1.0, elapsed / measured)

    def fraction(self) -> float:
        planned = sum(sum(v.values()) for v in self.plan.values())
        done = sum(min(n, self.plan.get(d, {}).get(s, 0)) for d, v in self.done.items() for s, n in v.items())
        return done / planned if planned else 1.0

    def line(self, now: float | None = None) -> str:
        """e.g. 'run 42% · 3m10s elapsed · ~4m20s left'."""
        now = now or time.time()
        left = self.remaining_s(now)
        eta = "estimating time left" if left is None else f"~{_duration(left)} left"
        return f"run {self.fraction():.0%} · {_duration(now - self.started)} elapsed · {eta}"


def _duration(seconds: float) -> str:
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def pending_by_suite(run: RunDir, name: str) -> dict[str, int]:
    """Items of a deployment with no record yet, per suite it will run (the plan of a run or resume)."""
    from evalkit.capabilities import runnable_suites
    from evalkit.scoring import score_context
    from evalkit.store import record_key
    from evalkit.suites import enabled_suites

    ctx, config = score_context(run)
    done = run.done_keys(name)
    suites = runnable_suites(enabled_suites(config, ctx.config_file), run.manifest(), name)
    return {s.name: sum(1 for i in s.items() if record_key(s.name, i.item_id) not in done) for s in suites}
