"""The driver's engine-result cache pass: items whose every engine call is already cached are recorded on
the driver, so a cache hit never ships work (or a model load) to a node.

It runs each pending item alone through a cached engine whose real engine refuses to load: an item that
needs the model raises `_NeedsEngine` and stays pending for a node. Only descriptions stored by an earlier
load of this very deployment identity (see `evalkit.cache.open_engine`) can key hits, so without one the
pass does nothing.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from evalkit.worker import UnitWork


class _NeedsEngine(BaseException):
    """The item needs the real engine. A BaseException so a suite's own `except Exception` cannot turn it
    into an error record."""


def serve_from_cache(work: UnitWork, record: Callable[[list[dict[str, Any]]], None],
                     on_done: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Record the unit's items the cache fully answers; returns how many. `on_done` receives the engine
    description a worker would have written (the stored description and the cache's hit/miss counts)."""
    from evalkit.cache import (
        CachedEngine, LazyEngine, ResultCache, info_from_json, engine_identity, entry_key, key_parts_from_info, weights_known,
    )
    from evalkit.engines.tokenizer import load_tokenizer

    dep, resolved, name = work.deployment, work.resolved, work.unit.deployment
    if not weights_known(resolved):  # a served model is described by its server: only a node asks it
        return 0
    identity = engine_identity(dep.engine, resolved, dep.options)
    stored = ResultCache().get(entry_key(identity, "engine_info", {}))
    if stored is None:
        return 0
    try:
        info = info_from_json(stored)
    except TypeError:
        return 0

    def refuse() -> Any:
        raise _NeedsEngine()

    lazy = LazyEngine(dep.engine, refuse, info, lambda: load_tokenizer(dep.engine, str(resolved["path"]), dep.options))
    parts = key_parts_from_info(info, resolved.get("variant"), dep.options, resolved.get("sha256"), int(resolved.get("replicate", 0)))
    engine = CachedEngine(lazy, parts, tokenizer_parts=identity, measurements=True)
    served = 0
    try:
        for suite, items in work.suites:
            suite.cache_pass = True  # a suite that would wait on another unit (streaming KLD) must not, here
            for item in items:
                out: list[dict[str, Any]] = []
                try:
                    suite.run(engine, [item], work.sampling, out.extend)
                except _NeedsEngine:
                    continue
                for r in out:
                    r.setdefault("suite", suite.name)
                    r["deployment"] = name
                record(out)
                served += len(out)
    except Exception as e:  # e.g. no tokenizer library on the driver: the nodes do everything
        print(f"evalkit: note: {name}: cache pass on the driver stopped ({type(e).__name__}: {e})", file=sys.stderr)
    finally:
        for suite, _ in work.suites:
            suite.cache_pass = False
        lazy.close()
    if on_done is not None and served:
        on_done({**info.__dict__, **engine.run_stats()})
    return served
