"""One unit's work: load the engine once (only if a request misses the engine-result cache), run every
pending item of its suites, and hand each batch of records to a sink.

`run_unit` is the one function both executors use: the local executor runs it in a subprocess
(`python -m evalkit.worker RUN_DIR DEPLOYMENT`) whose sink appends to the run directory; the Ray executor
runs it in a Ray task whose sink streams records back to the driver, the only writer. A crash or
out-of-memory here loses only the unit's unfinished items (finished ones are already recorded), and the
memory goes back to the OS when the process exits, before the next unit loads.
"""
from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from evalkit.capabilities import runnable_suites
from evalkit.config import Config
from evalkit.engines import load_engine
from evalkit.cache import ResultCache
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import EXIT_USER_ERROR, EvalkitError
from evalkit.executors.units import Unit, shard_of
from evalkit.progress import RunProgress
from evalkit.store import RunDir, atomic_write_text, record_key
from evalkit.suites import enabled_suites
from evalkit.suites.base import Item, RunBinding, Suite
from evalkit.terminal import TERMINAL, say


@dataclass
class UnitWork:
    """Everything a unit needs, picklable: a node running it never reads the run directory."""

    unit: Unit
    deployment: Any  # the config's deployment (a noise-floor rerun carries its base's spec)
    resolved: dict[str, Any]  # the manifest's entry: path, sha256, variant, replicate
    suites: list[tuple[Suite, list[Item]]]  # pending items only
    sampling: SamplingParams
    use_cache: bool

    @property
    def n_items(self) -> int:
        return sum(len(items) for _, items in self.suites)

    def keys(self) -> set[str]:
        return {record_key(s.name, i.item_id) for s, items in self.suites for i in items}


class RecordSink(Protocol):
    """Where a unit's output goes: records (each batch durable before the call returns), its description."""

    def begin(self, suite: str, total: int) -> None: ...

    def write(self, suite: str, records: list[dict[str, Any]]) -> None: ...

    def end(self, suite: str, seconds: float) -> None: ...

    def describe(self, described: dict[str, Any]) -> None: ...


def unit_work(run: RunDir, unit: Unit) -> UnitWork | None:
    """The unit's still-pending items, read from the run directory (None: nothing left to do)."""
    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    config_file = Path(manifest["config_file"])
    resolved = manifest["deployments"][unit.deployment]
    deployment = config.deployment(resolved.get("base", unit.deployment))
    done = run.done_keys(unit.deployment)
    suites: list[tuple[Suite, list[Item]]] = []
    # Suites the plan skipped for this deployment (its engine lacks a capability) are not run.
    for suite in runnable_suites(enabled_suites(config, config_file), manifest, unit.deployment):
        # The perplexity suite reads (the reference writes) the reference's stored distributions there.
        suite.bind(RunBinding(run.path, unit.deployment, manifest["reference"]))
        mine = shard_of(suite.items(), unit.shard, unit.shards)
        pending = [i for i in mine if record_key(suite.name, i.item_id) not in done]
        if pending:
            suites.append((suite, replicate_order(pending, int(resolved.get("replicate", 0)), suite.name)))
    if not suites:
        return None
    sampling = config.sampling.model_dump()
    sampling["seed"] = sampling["seed"] + int(resolved.get("replicate", 0))  # the noise floor's rerun: another seed
    return UnitWork(unit, deployment, dict(resolved), suites, SamplingParams(**sampling),
                    bool(manifest.get("use_cache", True)))


def replicate_order(items: list[Item], replicate: int, suite: str) -> list[Item]:
    """The items in the order replicate `replicate` submits them: the run's order for the first run, a seeded
    shuffle for the noise floor's rerun, so its batches hold other neighbours (a batch's composition changes
    the kernels' reduction order, which is part of the noise the floor measures)."""
    if replicate == 0:
        return items
    shuffled = list(items)
    random.Random(f"{replicate}/{suite}").shuffle(shuffled)
    return shuffled


def node_info() -> dict[str, Any]:
    """Where this process runs: host, process, and the devices it may use (Ray's view when inside Ray)."""
    info: dict[str, Any] = {"hostname": platform.node(), "pid": os.getpid(),
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    ray = sys.modules.get("ray")  # inside a Ray worker it is imported already; never import it to find out
    if ray is not None:
        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            info["ray_node_id"] = ctx.get_node_id()
            info["accelerators"] = {k: list(v) for k, v in ctx.get_accelerator_ids().items() if v}
    return info


def run_unit(
    work: UnitWork,
    sink: RecordSink,
    model_path: str | None = None,
    on_cache_put: Callable[[str, Any, str | None], None] | None = None,
    before_suites: Callable[[Engine], None] | None = None,
) -> None:
    """Run every pending item of `work` on one engine (loaded once, only when the cache cannot answer).

    `on_cache_put` sees every engine-result cache entry this unit writes (the Ray executor sends them to the
    driver's cache, which then answers the next run without shipping work). `before_suites` is called with the
    engine before any suite runs (a held worker loads it, then waits for its turn)."""
    name = work.unit.deployment
    resolved = {**work.resolved, "path": model_path or work.resolved["path"]}
    os.environ["EVALKIT_DEPLOYMENT"] = name  # what a server started for this unit is called (its log file)
    engine: Engine
    if work.use_cache:
        from evalkit.cache import open_engine

        cached = open_engine(work.deployment, resolved, name)
        if on_cache_put is not None:
            cached.store = _TeeCache(cached.store.root, on_cache_put)
        engine = cached
    else:
        engine = load_engine(work.deployment.engine, resolved["path"], work.deployment.options, name)
    described: dict[str, Any] = {"deployment": name, "worker_pid": os.getpid(), **engine.info().__dict__}
    sink.describe(described)
    try:
        if before_suites is not None:
            before_suites(engine)
        for suite, items in work.suites:
            sink.begin(suite.name, len(items))

            def emit(records: list[dict[str, Any]], _suite: str = suite.name) -> None:
                for r in records:
                    r.setdefault("suite", _suite)
                    r["deployment"] = name
                sink.write(_suite, records)

            start = time.perf_counter()
            suite.run(engine, items, work.sampling, emit)
            sink.end(suite.name, time.perf_counter() - start)
        stats = engine.run_stats()  # wrappers say what the cache saved and whether the engine loaded at all
        if stats:
            # The real engine's description when it was loaded during this run (its load_s is this run's).
            described.update({"deployment": name, "worker_pid": os.getpid(), **engine.info().__dict__})
            described.update(stats)
            sink.describe(described)
    finally:
        engine.close()


class _TeeCache(ResultCache):
    """The unit's result cache (the same directory), also telling a listener about every entry it stores."""

    def __init__(self, root: Path, listener: Callable[[str, Any, str | None], None]) -> None:
        super().__init__(root)
        self.listener = listener

    def put(self, key: str, value: Any, measured_at: str | None = None) -> None:
        super().put(key, value, measured_at)
        self.listener(key, value, measured_at)


def engine_file(run: RunDir, deployment: str) -> Path:
    return run.path / "engines" / f"{deployment}.json"


def write_description(run: RunDir, deployment: str, described: dict[str, Any], unit: dict[str, Any]) -> None:
    """engines/<deployment>.json: the engine's description and every unit that ran it (node, devices).

    Earlier units (other shards, an interrupted attempt, a run resumed with another executor) are kept.
    """
    path = engine_file(run, deployment)
    units: list[dict[str, Any]] = []
    try:
        units = list(json.loads(path.read_text(encoding="utf-8")).get("units", []))
    except (OSError, ValueError, AttributeError):
        pass
    units = [u for u in units if (u.get("unit"), u.get("attempt_id")) != (unit.get("unit"), unit.get("attempt_id"))]
    out = {**described, "units": [*units, unit]}
    atomic_write_text(path, json.dumps(out, indent=2, default=str) + "\n")




class FileSink:
    """The local executor's sink: records appended to the run directory, progress on this terminal (per suite,
    and run-wide with elapsed and estimated time left)."""

    def __init__(self, run: RunDir, unit: Unit, executor: str = "local") -> None:
        self.run = run
        self.unit = unit
        self.writer = run.writer(unit.deployment)
        self.node = {"unit": unit.unit_id, "executor": executor, "attempt_id": f"{os.getpid()}-{time.time():.0f}",
                     **node_info()}
        self._bar: Any = None
        self._progress = RunProgress.load(run.path)
        self._last = time.perf_counter()

    def begin(self, suite: str, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=f"{self.unit.unit_id} · {suite}", unit="item", file=TERMINAL)
        self._last = time.perf_counter()

    def write(self, suite: str, records: list[dict[str, Any]]) -> None:
        self.writer.write_batch(records)
        if self._progress is not None:
            now = time.perf_counter()
            self._progress.record(self.unit.deployment, suite, len(records), now - self._last)
            self._last = now
            if self._bar is not None:
                self._bar.set_postfix_str(self._progress.line(), refresh=False)
        if self._bar is not None:
            self._bar.update(len(records))

    def end(self, suite: str, seconds: float) -> None:
        if self._bar is not None:
            n = self._bar.n
            self._bar.close()
            self._bar = None
            run_line = f" ({self._progress.line()})" if self._progress is not None else ""
            print(f"{self.unit.unit_id} · {suite}: {n} items in {seconds:.1f} s{run_line}", file=TERMINAL, flush=True)

    def describe(self, described: dict[str, Any]) -> None:
        write_description(self.run, self.unit.deployment, described, self.node)

    def close(self) -> None:
        self.writer.close()


def run_deployment(run_dir: Path, deployment_name: str, hold: bool = False) -> None:
    """The local executor's unit: a whole deployment, its records appended to the run directory. `hold`: load
    the engine, then wait for the driver's go before the suites (`evalkit.executors.warm.load_then_wait`)."""
    run = RunDir.open(run_dir)
    unit = Unit(deployment_name)
    work = unit_work(run, unit)
    if work is None:
        return
    sink = FileSink(run, unit)
    os.environ["EVALKIT_SERVER_LOG_DIR"] = str(run.path / "logs")  # a launched server's log goes beside ours
    try:
        if hold:
            from evalkit.executors.warm import load_then_wait, loading_for_later

            with loading_for_later():
                run_unit(work, sink, before_suites=load_then_wait)
        else:
            run_unit(work, sink)
    finally:
        sink.close()


def main(argv: list[str] | None = None) -> int:
    from evalkit.interrupts import keep_interrupts

    keep_interrupts()  # Ctrl-C landing in a destructor or an engine's callback still stops the worker
    args = sys.argv[1:] if argv is None else argv
    hold = False  # a held warm worker loads its engine, then waits for the driver's go (evalkit.executors.warm)
    if len(args) == 2 and args[0] == "--warm":  # started early by the local executor (evalkit.executors.warm)
        from evalkit.executors.warm import wait_for_order

        order = wait_for_order(args[1])
        if order is None:
            return 0
        args, hold = [order["run"], order["deployment"]], bool(order.get("hold"))
    if len(args) != 2:
        print("usage: python -m evalkit.worker RUN_DIR DEPLOYMENT", file=sys.stderr)
        return EXIT_USER_ERROR
    from evalkit.executors.warm import NotHanded

    try:
        run_deployment(Path(args[0]), args[1], hold=hold)
    except NotHanded:
        return 0
    except EvalkitError as e:
        say(f"evalkit: error: {e}")
        return EXIT_USER_ERROR
    except OSError as e:
        import errno

        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # The disk filled outside the records writer (engine description, progress): one line, finished items kept.
        say(f"evalkit: error: {e.filename or args[0]}: no space left on the device ({e.strerror}); free space and --resume")
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: vLLM's C++ threads can abort() during it ("terminate called without an
    # active exception") after all records are safely on disk. The process exit returns the memory anyway.
    os._exit(code)
