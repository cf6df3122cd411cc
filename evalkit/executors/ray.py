"""The Ray executor: units as Ray tasks with their deployments' resources, records streamed back to the
driver, which is the only writer of the run directory (no shared filesystem needed).

Each unit is a Ray streaming-generator task: it resolves and checks its model on its own node, runs
`evalkit.worker.run_unit` in a thread, and yields every batch of records the moment a suite emits it. The
driver appends each batch to `records/<deployment>.jsonl` (fsynced) as it arrives. When a worker process
or a whole node dies, the driver reads back what it has recorded and submits the unit again with only its
unrecorded items (Ray schedules it on whatever resources remain), up to `max_attempts` runs; a unit that
keeps failing marks its deployment failed and the others go on. Results the driver's engine-result cache
already holds are served on the driver: such items never reach a node.
"""
from __future__ import annotations

import hashlib
import json
import platform
import queue
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from evalkit.config import Config
from evalkit.errors import EvalkitError, ModelFileError
from evalkit.executors.provenance import record_execution
from evalkit.executors.units import Unit, UnitResources, engine_resources
from evalkit.store import SIDE_KEY, RecordWriter, RunDir, record_key
from evalkit.worker import UnitWork, node_info, run_unit, unit_work, write_description

_DONE = object()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# -- on the node -----------------------------------------------------------------------------------------


def node_model_path(work: UnitWork, node: dict[str, Any]) -> str | None:
    """The unit's model as this node sees it: resolved here (`pkg:`, a path, a variant prepared here,
    once per node), and byte-identical to what the manifest recorded, or one line naming node and file.
    None for a served model whose weights are not named (its server holds them)."""
    from evalkit.models import check_model, resolve_source

    dep, resolved = work.deployment, work.resolved
    if dep.model is None:
        return None
    where = f"node {node.get('hostname')} ({str(node.get('ray_node_id', ''))[:12]})"
    try:
        if dep.model.variant is not None:
            from evalkit.variants import prepare_variant

            path = Path(prepare_variant(dep.model.source, dep.model.variant, progress=False))
        else:
            path = resolve_source(dep.model.source)
        check_model(path, dep.model.source)
    except EvalkitError as e:
        raise ModelFileError(str(e.source), f"on {where}: {e.problem}") from None
    sha = _node_sha256(path)
    if sha != resolved.get("sha256"):
        raise ModelFileError(str(path), f"on {where}: sha256 {sha[:16]}... differs from the manifest's "
                                        f"{str(resolved.get('sha256'))[:16]}... (a different model file)")
    return str(path)


def _node_sha256(path: Path) -> str:
    """sha256 of a model, memoised on this node by (path, size, mtime): a 70B checkpoint is hashed once."""
    from evalkit.models import cache_dir, fingerprint
    from evalkit.store import atomic_write_text

    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    stamp = f"{path.resolve()}|{sum(p.stat().st_size for p in files)}|{max(p.stat().st_mtime_ns for p in files)}"
    memo = cache_dir() / "fingerprints" / (hashlib.sha256(stamp.encode()).hexdigest() + ".json")
    try:
        return str(json.loads(memo.read_text())["sha256"])
    except (OSError, ValueError, KeyError):
        sha = fingerprint(path).sha256
        atomic_write_text(memo, json.dumps({"path": str(path), "stamp": stamp, "sha256": sha}) + "\n")
        return sha


class _QueueSink:
    """A worker-side sink: every call becomes a message the task yields to the driver. Cache entries the
    unit writes travel with the next message."""

    def __init__(self, q: "queue.Queue[Any]") -> None:
        self.q = q
        self._entries: list[tuple[str, Any, str | None]] = []
        self._lock = threading.Lock()

    def cache_put(self, key: str, value: Any, measured_at: str | None = None) -> None:
        with self._lock:
            self._entries.append((key, value, measured_at))

    def _take(self) -> list[tuple[str, Any, str | None]]:
        with self._lock:
            out, self._entries = self._entries, []
        return out

    def begin(self, suite: str, total: int) -> None:
        self.q.put({"kind": "begin", "suite": suite, "total": total})

    def write(self, suite: str, records: list[dict[str, Any]]) -> None:
        self.q.put({"kind": "records", "suite": suite, "records": records, "cache": self._take()})

    def end(self, suite: str, seconds: float) -> None:
        self.q.put({"kind": "end", "suite": suite, "seconds": seconds, "cache": self._take()})

    def describe(self, described: dict[str, Any]) -> None:
        self.q.put({"kind": "describe", "described": described, "cache": self._take()})


def unit_task(work: UnitWork) -> Iterator[dict[str, Any]]:
    """The body of a unit's Ray task: messages for the driver, records as soon as a suite emits them."""
    node = node_info()
    yield {"kind": "node", "node": node}
    path = node_model_path(work, node)
    q: "queue.Queue[Any]" = queue.Queue()
    failure: list[BaseException] = []

    sink = _QueueSink(q)

    def body() -> None:
        try:
            run_unit(work, sink, model_path=path, on_cache_put=sink.cache_put)
        except BaseException as e:  # re-raised in the task: the driver sees the unit fail
            failure.append(e)
        finally:
            q.put(_DONE)

    # The engine runs in a thread so this generator can yield while a suite is still inside its run().
    thread = threading.Thread(target=body, name=f"evalkit-unit-{work.unit.unit_id}", daemon=True)
    thread.start()
    while (msg := q.get()) is not _DONE:
        yield msg
    thread.join()
    if failure:
        raise failure[0]


# -- on the driver ---------------------------------------------------------------------------------------


@dataclass
class _Attempt:
    unit: Unit
    work: UnitWork
    number: int
    resources: UnitResources
    pg: Any = None
    node: dict[str, Any] = field(default_factory=dict)
    submitted: str = field(default_factory=_now)
    started: str | None = None  # when its node reported in (it may wait for resources before)
    recorded: int = 0
    bars: dict[str, Any] = field(default_factory=dict)


class RayExecutor:
    kind = "ray"

    def __init__(self, address: str | None = None, max_attempts: int = 3, namespace: str = "evalkit") -> None:
        self.address = address
        self.max_attempts = max_attempts
        self.namespace = namespace

    # -- cluster -------------------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Join the cluster at `address` (None: start a local Ray instance). True if this call started Ray."""
        import ray

        if ray.is_initialized():
            return False
        ray.init(address=self.address, namespace=self.namespace, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)
        return True

    @staticmethod
    def cluster_description() -> dict[str, Any]:
        import ray

        nodes = [
            {"node_id": n["NodeID"], "hostname": n.get("NodeManagerHostname"), "address": n.get("NodeManagerAddress"),
             "resources": {k: v for k, v in n.get("Resources", {}).items() if not k.startswith("node:")}}
            for n in ray.nodes() if n.get("Alive")
        ]
        return {"ray_version": ray.__version__, "cluster_resources": dict(ray.cluster_resources()), "nodes": nodes}

    # -- the run ------------------------------------------------------------------------------------

    def run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        import ray

        started_here = self._connect()
        try:
            record_execution(run, {"kind": self.kind, "address": self.address, "driver_hostname": platform.node(),
                                   **self.cluster_description()})
            return _Driver(run, names, self.max_attempts).drive()
        finally:
            if started_here:
                ray.shutdown()


class _Driver:
    """Submits units, writes what they stream back, retries what died, and reports every unit's progress."""

    def __init__(self, run: RunDir, names: list[str], max_attempts: int) -> None:
        self.run = run
        self.names = names
        self.max_attempts = max_attempts
        manifest = run.manifest()
        self.config = Config.model_validate(manifest["config"])
        self.resolved = manifest["deployments"]
        self.use_cache = bool(manifest.get("use_cache", True))
        self.writers: dict[str, RecordWriter] = {}
        self.done: dict[str, set[str]] = {}
        self.failed: dict[str, str] = {}
        self.active: dict[Any, _Attempt] = {}
        self.positions = 0

    def _deployment(self, name: str) -> Any:
        return self.config.deployment(self.resolved[name].get("base", name))

    def units(self) -> list[Unit]:
        out: list[Unit] = []
        for name in self.names:
            n = self._deployment(name).replicas
            out.extend(Unit(name, i, n) for i in range(n))
        return out

    def drive(self) -> dict[str, int]:
        import ray

        from evalkit.executors.order import dependencies

        units = self.units()
        # A unit that reads another deployment's artefacts (perplexity's exact KLD reads the KLD reference's
        # stored distributions) waits until that deployment has no unit running or waiting.
        deps = dependencies(self.run, self.names)
        waiting = list(units)
        try:
            while self.active or waiting:
                busy = {a.unit.deployment for a in self.active.values()} | {u.deployment for u in waiting}
                ready = [u for u in waiting if not (deps[u.deployment] & busy)] or ([] if self.active else waiting[:1])
                if ready:
                    for unit in ready:
                        waiting.remove(unit)
                        self._start(unit, attempt=1)
                    continue
                done, _ = ray.wait(list(self.active), num_returns=1, timeout=1.0)
                for gen in done:
                    self._step(gen)
        finally:
            for att in list(self.active.values()):
                self._release(att)
            for w in self.writers.values():
                w.close()
        for name, why in self.failed.items():
            print(f"evalkit: deployment {name} failed: {why}; its finished items are kept", file=sys.stderr)
        return {name: (1 if name in self.failed else 0) for name in self.names}

    # -- one unit ---------------------------------------------------------------------------------

    def _writer(self, name: str) -> RecordWriter:
        if name not in self.writers:
            self.writers[name] = self.run.writer(name)  # cuts a torn tail, as every writer does
            self.done[name] = set(self.run.done_keys(name))
        return self.writers[name]

    def _start(self, unit: Unit, attempt: int) -> None:
        name = unit.deployment
        if name in self.failed:
            return
        self._writer(name)
        work = unit_work(self.run, unit)
        if work is not None and work.use_cache:
            work = self._serve_cached(work)
        if work is None:
            return
        dep = self._deployment(name)
        res = engine_resources(dep.engine, dep.options)
        unfit = _never_fits(res)
        if unfit:
            self.failed[name] = f"unit {unit.unit_id} needs {unfit} on one node; no node of the cluster has it"
            return
        options, pg = schedule_options(res, f"evalkit:{unit.unit_id}:{attempt}")
        task = _remote_unit_task().options(**options)
        gen = task.remote(work)
        self.active[gen] = _Attempt(unit, work, attempt, res, pg)
        print(f"evalkit: unit {unit.unit_id} submitted ({work.n_items} items, {_fmt(res)}, attempt {attempt})",
              file=sys.stderr, flush=True)

    def _step(self, gen: Any) -> None:
        import ray

        att = self.active[gen]
        try:
            msg = ray.get(next(gen))
        except StopIteration:
            self._finish(gen, att, None)
            return
        except Exception as e:  # a worker or node died, or the unit raised: decided in _finish
            self._finish(gen, att, e)
            return
        self._handle(att, msg)

    def _handle(self, att: _Attempt, msg: dict[str, Any]) -> None:
        name = att.unit.deployment
        kind = msg["kind"]
        if msg.get("cache"):
            self._store_cache(msg["cache"])
        if kind == "node":
            att.node = msg["node"]
            att.started = _now()
        elif kind == "begin":
            from tqdm import tqdm

            self.positions += 1
            att.bars[msg["suite"]] = tqdm(total=msg["total"], desc=f"{att.unit.unit_id} · {msg['suite']} @ {att.node.get('hostname')}",
                                          unit="item", file=sys.stderr, position=self.positions - 1, leave=True)
        elif kind == "records":
            self._record(name, msg["records"], att)
            bar = att.bars.get(msg["suite"])
            if bar is not None:
                bar.update(len(msg["records"]))
        elif kind == "end":
            bar = att.bars.pop(msg["suite"], None)
            if bar is not None:
                bar.close()
        elif kind == "describe":
            write_description(self.run, name, msg["described"], self._unit_entry(att, "running"))
            if att.work.use_cache:
                self._store_info(att, msg["described"])

    def _record(self, name: str, records: list[dict[str, Any]], att: _Attempt | None) -> None:
        """Append a batch; an item already recorded (a retried unit's late duplicate) is never written twice."""
        done = self.done[name]
        fresh = []
        for r in records:
            key = record_key(r["suite"], r["item_id"])
            if key not in done:
                done.add(key)
                fresh.append(r)
        self.writers[name].write_batch(fresh)
        if self.use_cache:  # side files travel with their records: the driver's cache keeps them by hash too
            from evalkit.models import cache_dir
            from evalkit.sidefiles import write_side_file

            for r in fresh:
                if r.get(SIDE_KEY) is not None:
                    write_side_file(cache_dir(), r[SIDE_KEY])
        if att is not None:
            att.recorded += len(fresh)

    def _unit_entry(self, att: _Attempt, status: str, error: str | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "unit": att.unit.unit_id, "executor": "ray", "attempt": att.number,
            "attempt_id": f"{att.unit.unit_id}#{att.number}", "status": status, "submitted": att.submitted, "started": att.started,
            "items_assigned": att.work.n_items, "items_recorded": att.recorded,
            "resources": {"num_cpus": att.resources.num_cpus, "num_gpus": att.resources.num_gpus,
                          "gpu_bundles": att.resources.gpu_bundles}, **att.node,
        }
        if att.pg is not None:
            entry["placement_group"] = att.pg.id.hex()
        if status != "running":
            entry["ended"] = _now()
        if error:
            entry["error"] = error
        return entry

    def _finish(self, gen: Any, att: _Attempt, error: BaseException | None) -> None:
        self.active.pop(gen, None)
        self._release(att)
        name = att.unit.deployment
        for bar in att.bars.values():
            bar.close()
        att.bars.clear()
        if error is None:
            self._describe_end(att, "finished")
            return
        cause = getattr(error, "cause", None) or error
        line = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        self._describe_end(att, "failed", line)
        if isinstance(cause, EvalkitError):  # a user's mistake (e.g. the wrong model file): trying again won't help
            self.failed[name] = str(cause)
            return
        if att.number >= self.max_attempts:
            self.failed[name] = f"unit {att.unit.unit_id} failed {att.number} times (last: {type(cause).__name__}: {line})"
            return
        print(f"evalkit: unit {att.unit.unit_id} lost on {att.node.get('hostname') or 'a node'} ({type(cause).__name__}); "
              f"{att.recorded} items were recorded, retrying the rest", file=sys.stderr, flush=True)
        self._start(att.unit, att.number + 1)

    def _describe_end(self, att: _Attempt, status: str, error: str | None = None) -> None:
        path = self.run.path / "engines" / f"{att.unit.deployment}.json"
        try:
            described = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if k != "units"}
        except (OSError, ValueError):
            described = {"deployment": att.unit.deployment}
        write_description(self.run, att.unit.deployment, described, self._unit_entry(att, status, error))

    @staticmethod
    def _release(att: _Attempt) -> None:
        if att.pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(att.pg)
            except Exception:  # already gone with its node
                pass
            att.pg = None

    # -- the engine-result cache, on the driver ----------------------------------------------------

    @staticmethod
    def _store_cache(entries: list[tuple[str, Any, str | None]]) -> None:
        """A node's new cache entries, into the driver's cache (no shared filesystem needed), with the time
        each result was measured."""
        from evalkit.cache import ResultCache

        store = ResultCache()
        for key, value, measured_at in entries:
            if store.get(key) is None:
                store.put(key, value, measured_at)

    def _store_info(self, att: _Attempt, described: dict[str, Any]) -> None:
        """The engine description a node reported, under the driver's identity of the deployment, so the
        driver's cache pass can key hits next time without loading anything itself."""
        from dataclasses import fields

        from evalkit.cache import ResultCache, info_to_json, engine_identity, entry_key
        from evalkit.engines.base import EngineInfo

        dep = att.work.deployment
        key = entry_key(engine_identity(dep.engine, self.resolved[att.unit.deployment], dep.options), "engine_info", {})
        store = ResultCache()
        if store.get(key) is None:
            names = {f.name for f in fields(EngineInfo)}
            store.put(key, info_to_json(EngineInfo(**{k: v for k, v in described.items() if k in names})))

    def _serve_cached(self, work: UnitWork) -> UnitWork | None:
        """Record every pending item the driver's cache can answer; what is left goes to a node."""
        from evalkit.executors.cached import serve_from_cache

        served = serve_from_cache(work, lambda recs: self._record(work.unit.deployment, recs, None))
        if served:
            print(f"evalkit: unit {work.unit.unit_id}: {served} items answered by the engine-result cache", file=sys.stderr)
        return unit_work(self.run, work.unit) if served else work


_REMOTE: Any = None


def _remote_unit_task() -> Any:
    global _REMOTE
    if _REMOTE is None:
        import ray

        # max_calls=1: a fresh worker process per unit, as the local executor's subprocess, so an engine's
        # memory (and vLLM's process-wide state) goes back to the OS when the unit ends.
        _REMOTE = ray.remote(max_calls=1)(unit_task)
    return _REMOTE


def schedule_options(res: UnitResources, name: str) -> tuple[dict[str, Any], Any]:
    """Ray task options for a unit with `res` (and its placement group, if it needs one). Ray, not evalkit,
    picks the node and sets the visible devices."""
    options: dict[str, Any] = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_retries": 0, "name": name}
    if not res.gpu_bundles:
        return options, None
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # One node holds every rank; the engine's own workers (vLLM's, one per GPU) join this group.
    pg = placement_group(res.bundles(), strategy="STRICT_PACK", name=name)
    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
    options["num_gpus"] = 0  # the GPUs are the bundles', for the ranks; the unit's process takes bundle 0's CPU
    return options, pg


def _never_fits(res: UnitResources) -> str | None:
    """What the unit needs if no single alive node can ever offer it (a unit never spans nodes)."""
    import ray

    need = res.largest_node_need()
    for n in ray.nodes():
        if n.get("Alive") and all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in need.items()):
            return None
    return ", ".join(f"{v:g} {k}" for k, v in need.items())


def _fmt(res: UnitResources) -> str:
    if res.gpu_bundles:
        return f"placement group of {res.gpu_bundles} x 1 GPU on one node"
    parts = [f"{res.num_cpus:g} CPU"] + ([f"{res.num_gpus:g} GPU"] if res.num_gpus else [])
    return " + ".join(parts)
