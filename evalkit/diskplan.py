"""The disk a run needs, known from its config before anything runs, and the refusal when it cannot fit.

By kind: records (JSONL lines), side files (per-token arrays, evalkit.sidefiles), the exact-KLD reference's
stored distributions (evalkit.metrics.kld; at most a window of chunks in streaming mode) and the engine-result
cache (entries, side files and reference stores again, content-addressed). Sizes come from the config alone:
the perplexity text's bytes (tokens estimated at BYTES_PER_TOKEN, a conservative figure for BPE tokenizers
on English: WikiText-2 is ~4.4 bytes per SmolLM2 token), the vocabulary read from the model's header or
config.json (nothing loaded), and the side-file layout each deployment's role gets.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalkit.errors import EvalkitError
from evalkit.suites.perplexity import BYTES_PER_TOKEN

RECORD_BYTES = 1000  # a v2 perplexity records line is < 1 KB
OTHER_RECORD_BYTES = 4000  # a prompts / MMLU / long-context / HumanEval / cost line, generously
CACHE_ENTRY_BYTES = 1000  # one result-cache entry's JSON envelope (perplexity: scalars + the side file's hash)
NPY_HEADER = 128


@dataclass
class DiskPlan:
    """Bytes by kind for one run; `window_bytes` is what the distributions take in streaming mode."""

    records: int = 0
    side_files: int = 0
    distributions: int = 0
    cache: int = 0
    window: int | None = None  # suites.perplexity.kld_window in force
    distributions_full: int = 0  # the whole store (what the stored mode keeps)
    distributions_per_chunk: int = 0
    notes: list[str] = field(default_factory=list)

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


def _vocab(config: Any, config_file: Path, name: str) -> int | None:
    """The deployment's vocabulary from its model's header or config.json, without loading it (None: unknown)."""
    from evalkit.weights import gguf_weights, hf_weights, local_model_path

    dep = config.deployment(name)
    try:
        path = local_model_path(dep.model.source, config_file)
        return (hf_weights(path) if path.is_dir() else gguf_weights(path)).arch.vocab if path is not None else None
    except Exception:  # an unreadable model is the ledger's row to report
        return None


def disk_plan(config: Any, config_file: Path, use_cache: bool = True) -> DiskPlan:
    from evalkit.suites.perplexity.records import token_dtype
    from evalkit.suites import enabled_suites
    from evalkit.suites.perplexity import (PerplexitySuite, bound_deployments, chunk_count, kld_reference,
                                           store_bytes_upper_bound)

    plan = DiskPlan()
    suites = enabled_suites(config, config_file)
    names = [d.name for d in config.deployments] + ([config.reference + ".rerun"] if config.noise_floor else [])

    def base(n: str) -> str:  # a noise-floor re-run is its deployment's
        return n.removesuffix(".rerun")

    for suite in suites:
        runs = [n for n in names if config.deployment(base(n)).runs(suite.name)]
        if isinstance(suite, PerplexitySuite):
            s = suite.settings
            n_bytes = len(suite.text_bytes())
            chunks = min(len(suite.items()), chunk_count(int(n_bytes / BYTES_PER_TOKEN) + 2, s.n_ctx, s.max_chunks))
            per_chunk = s.n_ctx - s.first_scored()
            from evalkit.suites.perplexity import streaming_readers

            owner = kld_reference(config) if streaming_readers(config) else None  # no reader: nothing stored
            bound = set(bound_deployments(config))
            from evalkit.engines import gives_full_distributions

            for n in runs:
                dep = config.deployment(base(n))
                top_k = suite.top_k_for(n, full=gives_full_distributions(dep.engine))
                if n == owner:
                    fields = ["token", "nll", "argmax"]
                elif owner is not None and gives_full_distributions(dep.engine) and n not in bound:
                    fields = ["token", "nll", "kld", "same_top"]
                else:
                    fields = ["token", "nll"]
                row = token_dtype(fields + (["top_ids", "top_lp"] if top_k else []), top_k, _vocab(config, config_file, base(n)))
                side = chunks * (per_chunk * row.itemsize + NPY_HEADER)
                plan.records += chunks * RECORD_BYTES
                plan.side_files += side
                plan.cache += (chunks * CACHE_ENTRY_BYTES + side) if use_cache else 0
            if owner is not None and owner in runs:
                vocab = _vocab(config, config_file, owner)
                if vocab:
                    plan.distributions_per_chunk = store_bytes_upper_bound(per_chunk, vocab)
                    plan.distributions_full = chunks * plan.distributions_per_chunk
                    plan.window = s.kld_window
                    plan.distributions = plan.distributions_per_chunk * min(chunks, s.kld_window or chunks)
                    if use_cache and not s.kld_window:  # the cache keeps each reference chunk's store too
                        plan.cache += plan.distributions_full
                else:
                    plan.notes.append(f"the size of {owner}'s stored distributions is unknown (its vocabulary is)")
            plan.notes.append(f"perplexity: ~{chunks:,} chunks x {len(runs)} deployments (tokens estimated at "
                              f"{BYTES_PER_TOKEN:g} text bytes each)")
        else:
            items = len(suite.items())
            plan.records += items * OTHER_RECORD_BYTES * len(runs)
            plan.cache += items * OTHER_RECORD_BYTES * len(runs) if use_cache else 0
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
                hint = (f"; streaming exact KLD fits: set suites.perplexity.kld_window: {min(window, 8)} (the reference's "
                        f"distributions are then deleted once read, so a deployment added later needs the reference re-run)")
        raise EvalkitError(where[dev], f"not enough disk for this run: it needs ~{size(n)} "
                                       f"({', '.join(plan.lines()[0].removeprefix('disk: ').split('; '))}), "
                                       f"{size(free[dev])} free{hint}")
