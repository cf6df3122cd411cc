"""The local executor: one subprocess per deployment, one after another (a deployment is one unit here:
shards would only load the same engine again on the same machine)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from evalkit.executors.provenance import record_execution
from evalkit.executors.warm import WarmWorker
from evalkit.store import RunDir


class LocalExecutor:
    kind = "local"

    def __init__(self) -> None:
        self._warm: WarmWorker | None = None

    def prestart(self, engine: str) -> None:
        """Start a worker now, importing `engine`'s library before its deployment's turn: while the driver still
        prepares the run, or beside a deployment that leaves cores free."""
        from evalkit.engines import engine_spec

        if self._warm is None and engine_spec(engine).warm_imports and _has_file_descriptor(sys.stderr):
            self._warm = WarmWorker(engine)

    def discard_prestarted(self) -> None:
        if self._warm is not None:
            self._warm.discard()
            self._warm = None

    def _start_worker(self, run: RunDir, member: str, engine: str, log_file: Path, env: dict[str, str], terminal: int,
                      later_engines: set[str]) -> subprocess.Popen:
        warm, self._warm = self._warm, None
        if warm is not None and warm.held_for is not None:  # handed its deployment early, engine loaded
            if warm.held_for != member:
                warm.discard()
            elif (started := warm.go()) is not None:  # None: it died meanwhile (go() discarded it); a fresh one starts
                return started
        elif warm is not None and warm.engine == engine:
            handed = warm.hand(run.path, member, log_file)
            if handed is not None:
                return handed
        elif warm is not None and warm.engine in later_engines:  # one engine per process: it waits for its own
            self._warm = warm
        elif warm is not None:
            warm.discard()
        with log_file.open("ab") as log:
            return subprocess.Popen([sys.executable, "-m", "evalkit.worker", str(run.path), member],
                                    env=env, stdout=log, stderr=log, pass_fds=(terminal,))

    def run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        try:
            return self._run(run, names)
        finally:
            self.discard_prestarted()  # every deployment served by the cache: the early worker was not needed

    def _run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        """The engines' own output (vLLM's and llama.cpp's logs, from Python and from C code, in the worker and
        in vLLM's child processes) goes to logs/<deployment>.log; evalkit's progress reaches the terminal
        through a duplicate of our stderr handed to the worker (EVALKIT_PROGRESS_FD)."""
        from evalkit.executors.order import (concurrent_groups, dependencies, dependency_order, interleave_narrow,
                                             narrow_deployments)
        from evalkit.progress import RunProgress, pending_by_suite

        # A deployment that reads another's artefacts (the KLD reference's stored distributions) runs after it.
        deps = dependencies(run, names)
        names = dependency_order(names, deps)
        groups = concurrent_groups(run, names)  # deployments that must run at once (streaming exact KLD)
        # One-thread deployments each run before another, whose worker imports its engine beside them.
        narrow = {n for n in narrow_deployments(run, names) if len(groups.get(n, [n])) == 1}
        names = interleave_narrow(names, deps, narrow)
        engines = {n: str(d.get("engine")) for n, d in run.manifest()["deployments"].items()}
        record_execution(run, {"kind": self.kind, "hostname": platform.node()})
        RunProgress.start(run.path, {n: pending_by_suite(run, n) for n in names})
        logs = run.path / "logs"
        logs.mkdir(exist_ok=True)
        codes: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in codes:
                continue
            group = groups.get(name, [name])
            held = self._warm is not None and self._warm.held_for == name  # the cache was asked when it was handed
            if len(group) == 1 and not held and _served_by_cache(run, name):  # nothing left for an engine: no worker
                codes[name] = 0
                continue
            procs = {}
            terminal = os.dup(sys.stderr.fileno())
            env = {**os.environ, "EVALKIT_PROGRESS_FD": str(terminal)}
            try:
                for member in group:
                    log_file = logs / f"{member}.log"
                    print(f"evalkit: running deployment {member} (engine log: {log_file})"
                          + (f", at the same time as {', '.join(m for m in group if m != member)}" if len(group) > 1 else ""),
                          file=sys.stderr, flush=True)
                    later = {engines[n] for n in names[i + 1:]}
                    procs[member] = self._start_worker(run, member, engines[member], log_file, env, terminal, later)
                if name in narrow and i + 1 < len(names):
                    self._prepare_next(run, name, names[i + 1], engines[names[i + 1]], len(groups.get(names[i + 1], [])) <= 1)
                for member, proc in procs.items():
                    codes[member] = proc.wait()
            finally:
                for proc in procs.values():
                    if proc.poll() is None:  # interrupted: take the group's other workers down too
                        proc.kill()
                        proc.wait()
                os.close(terminal)
            for member in group:
                if codes.get(member, 1) != 0:
                    log_file = logs / f"{member}.log"
                    print(f"evalkit: deployment {member} failed (exit {codes.get(member)}); its finished items are kept; "
                          f"last lines of {log_file}:\n{_tail(log_file)}", file=sys.stderr)
        return codes

    def _prepare_next(self, run: RunDir, narrow: str, following: str, engine: str, alone: bool) -> None:
        """Beside the one-thread deployment `narrow`: start `following`'s worker, which imports its engine and,
        where both fit in memory together and the cache cannot answer everything, loads it too and waits. A worker
        started while variants were made (`prestart`) is that worker when its engine is `following`'s."""
        if self._warm is not None and (self._warm.held_for is not None or self._warm.engine != engine):
            return  # it waits for another deployment (held, or a later one of its own engine); one early worker at a time
        self.prestart(engine)
        if self._warm is None:
            return
        load = alone and _fit_together(run, narrow, following) and not _served_by_cache(run, following)
        print(f"evalkit: {following}'s worker {'imports its engine and loads it' if load else 'imports its engine'} "
              f"meanwhile ({narrow} computes on fewer threads than there are cores)", file=sys.stderr, flush=True)
        if load:
            self._warm.hand(run.path, following, run.path / "logs" / f"{following}.log", hold=True)


def _fit_together(run: RunDir, first: str, second: str) -> bool:
    """Whether the memory ledger (the manifest's) says both deployments fit in this host's free memory at once,
    the second on the CPU (a GPU engine's early load could take memory the first one's device needs)."""
    import psutil

    rows = {r.get("deployment"): r for r in run.manifest().get("ledger") or [] if isinstance(r, dict)}
    need = [b for b in (rows.get(n, {}).get("need_bytes") for n in (first, second)) if isinstance(b, int)]
    if len(need) != 2 or not str(rows[second].get("devices", "")).startswith("CPU"):
        return False
    return sum(need) <= psutil.virtual_memory().available


def _has_file_descriptor(stream: object) -> bool:
    """False for a stream that is not a file (a notebook's, pytest's capture): there is nothing to hand a worker."""
    try:
        fileno = getattr(stream, "fileno", None)
        return fileno is not None and isinstance(fileno(), int)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both an OSError and a ValueError
        return False


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_bytes()[-8192:].decode("utf-8", errors="replace")
    return "\n".join("    " + ln for ln in text.strip().splitlines()[-lines:])


def _served_by_cache(run: RunDir, name: str) -> bool:
    """Record what the engine-result cache answers for `name` here, in the driver, as the Ray executor does;
    True when nothing is left for a worker. A fully cached re-run then starts no process per deployment (a
    worker's start-up, imports and tokenizer cost seconds each; the cache answers in milliseconds)."""
    import time

    from evalkit.executors.cached import serve_from_cache
    from evalkit.executors.units import Unit
    from evalkit.progress import RunProgress
    from evalkit.worker import node_info, unit_work, write_description

    unit = Unit(name)
    work = unit_work(run, unit)
    if work is None:
        return True
    if not work.use_cache:
        return False
    served: dict[str, list[dict]] = {}  # suite -> records, appended in one batch per suite below
    seconds: dict[str, float] = {}  # suite -> time spent answering its items
    last = time.perf_counter()

    def keep(records: list[dict]) -> None:
        nonlocal last
        now = time.perf_counter()
        for r in records:
            served.setdefault(r["suite"], []).append(r)
        if records:
            seconds[records[0]["suite"]] = seconds.get(records[0]["suite"], 0.0) + now - last
        last = now

    described: dict = {}
    serve_from_cache(work, keep, on_done=described.update)
    if not served:
        return False
    progress = RunProgress.load(run.path)
    with run.writer(name) as writer:
        for suite, records in served.items():
            writer.write_batch(records)
            if progress is not None:
                progress.record(name, suite, len(records), seconds.get(suite, 0.0))
            print(f"{name} · {suite}: {len(records)} items in {seconds.get(suite, 0.0):.1f} s (engine-result cache, "
                  "no engine started)", file=sys.stderr, flush=True)
    with (run.path / "logs" / f"{name}.log").open("a", encoding="utf-8") as log:
        log.write(f"evalkit: {sum(map(len, served.values()))} items answered by the engine-result cache in the "
                  "driver (no worker process, no engine)\n")
    left = unit_work(run, unit)
    if left is None and described:
        node = {"unit": unit.unit_id, "executor": "local", "attempt_id": f"{os.getpid()}-{time.time():.0f}",
                "served_from_cache": True, **node_info()}
        write_description(run, name, {"deployment": name, "worker_pid": None, **described}, node)
    return left is None
