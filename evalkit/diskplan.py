"""The disk a run needs, known from its config before anything runs, and the refusal when it cannot fit.

By kind: records (JSONL lines), side files (per-token arrays, evalkit.sidefiles), stores a suite keeps in the run
directory (the exact-KLD reference's distributions; at most a window of chunks in streaming mode) and the
engine-result cache (entries, side files and stores again, content-addressed). Sizes come from the config alone:
each enabled suite's own estimate (SuiteSpec.disk: the perplexity suite sizes its side files by each deployment's
role, its text's bytes and the model's vocabulary), else its items' records at a generous size per line.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.errors import EvalkitError
from evalkit.suites.spec import DiskNeed

OTHER_RECORD_BYTES = 4000  # a records line of a suite without a disk estimate (prompts, MMLU, cost, ...), generously


@dataclass
class DiskPlan(DiskNeed):
    """Bytes by kind for one run, the enabled suites' needs added up; `window` is the stores' streaming window in
    force (at most that many chunks at a time), `window_setting` the setting that sets it."""

    @property
    def run_bytes(self) -> int:
        return self.records + self.side_files + self.distributions

    def lines(self) -> list[str]:
        gb = size
        mode = f" (streaming: at most {self.window} chunks at a time)" if self.window else ""
        out = [f"disk: run directory {gb(self.run_bytes)} = records {gb(self.records)} + side files {gb(self.side_files)} "
               f"+ reference distributions {gb(self.distributions)}{mode}; result cache {gb(self.cache)} more"]
        return out + [f"disk: {n}" for n in self.notes]


def size(n: float) -> str:
    """Bytes in GB (10^9), or MB below 1 GB."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def disk_plan(config: Any, config_file: Path, use_cache: bool = True) -> DiskPlan:
    from evalkit.suites import enabled_suites, suite_spec

    plan = DiskPlan()
    names = [d.name for d in config.deployments] + ([config.reference + ".rerun"] if config.noise_floor else [])
    for suite in enabled_suites(config, config_file):
        runs = [n for n in names if config.deployment(n.removesuffix(".rerun")).runs(suite.name)]  # a re-run is its deployment's
        estimate = suite_spec(suite.name).disk
        if estimate is None:
            items = len(suite.items())
            plan.records += items * OTHER_RECORD_BYTES * len(runs)
            plan.cache += items * OTHER_RECORD_BYTES * len(runs) if use_cache else 0
            continue
        need = estimate(suite, config, config_file, runs, use_cache)
        plan.records += need.records
        plan.side_files += need.side_files
        plan.distributions += need.distributions
        plan.cache += need.cache
        if need.distributions_per_chunk:
            plan.window, plan.window_setting = need.window, need.window_setting
            plan.distributions_full, plan.distributions_per_chunk = need.distributions_full, need.distributions_per_chunk
        plan.notes += need.notes
    return plan


def _free(path: Path) -> tuple[Path, int]:
    """The nearest existing ancestor of `path` and the bytes free on its filesystem."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return p, shutil.disk_usage(p).free


def check_disk(plan: DiskPlan, out_dir: Path, cache_dir: Path | None) -> None:
    """Refuse, in one line, a run whose files cannot fit where they go (run directory and cache on their
    filesystems; together where they share one). Suggests streaming KLD when that would fit."""
    out, out_free = _free(out_dir)
    need = {out.stat().st_dev: plan.run_bytes}
    free = {out.stat().st_dev: out_free}
    where = {out.stat().st_dev: str(out_dir)}
    if cache_dir is not None and plan.cache:
        c, c_free = _free(cache_dir)
        dev = c.stat().st_dev
        need[dev] = need.get(dev, 0) + plan.cache
        free[dev] = c_free
        where.setdefault(dev, str(cache_dir))
    for dev, n in need.items():
        if n <= free[dev]:
            continue
        hint = ""
        if plan.distributions_full and not plan.window and plan.distributions_per_chunk:
            lean = n - plan.distributions_full - (plan.distributions_full if cache_dir is not None and dev in need else 0)
            room = free[dev] - max(lean, 0)
            window = int(room // plan.distributions_per_chunk) if room > 0 else 0
            if window >= 1:
                hint = (f"; streaming exact KLD fits: set {plan.window_setting}: {min(window, 8)} (the reference's "
                        f"distributions are then deleted once read, so a deployment added later needs the reference re-run)")
        raise EvalkitError(where[dev], f"not enough disk for this run: it needs ~{size(n)} "
                                       f"({', '.join(plan.lines()[0].removeprefix('disk: ').split('; '))}), "
                                       f"{size(free[dev])} free{hint}")
