"""A worker started before its deployment's turn: it imports its engine's library (vLLM: about 12 s of a
2-core CPU) while the driver prepares model variants that are not in the cache yet (a fresh machine's hf
variant: 17 s), or while a deployment fixed to fewer threads than there are cores runs (the one-thread KLD
references), then waits until the local executor hands it a deployment. At the start only while variants
are made: otherwise the driver is ready in a second or two, and a fully cached re-run needs no worker at all.

Nothing is written meanwhile: the worker's output goes to an unnamed temporary file, copied into the
deployment's log when it is handed one. A worker never handed one (bad input, a fully cached deployment,
another engine first) is killed: it only imported modules.

Beside a one-thread deployment the worker is handed its deployment at once, held (`hand(hold=True)`): it also
loads the engine (vLLM's start-up, ~4 s of mostly one core on a 2-core CPU), then waits for `go()`, so the
deployment computes from its first second when its turn comes. Its threads are sized for running alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator

STARTED_EARLY = "evalkit: this worker started before its deployment's turn"


class WarmWorker:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.held_for: str | None = None  # the deployment it loaded early and waits to run (`hand(hold=True)`)
        self._output: IO[bytes] = tempfile.TemporaryFile()
        self._terminal = os.dup(sys.stderr.fileno())  # progress lines reach our terminal, as the executor's workers
        env = {**os.environ, "EVALKIT_PROGRESS_FD": str(self._terminal)}
        self.proc = subprocess.Popen([sys.executable, "-m", "evalkit.worker", "--warm", engine],
                                     stdin=subprocess.PIPE, stdout=self._output, stderr=self._output,
                                     env=env, pass_fds=(self._terminal,))

    def hand(self, run_path: Path, deployment: str, log_file: Path, hold: bool = False) -> subprocess.Popen | None:
        """The worker, now running `deployment` of the run with its output appended to `log_file`; None when it
        died while waiting (the caller starts a fresh one, whose load then says what is wrong). `hold`: it loads
        the deployment's engine, then waits for `go()` before running anything."""
        assert self.proc.stdin is not None
        order = {"run": str(run_path), "deployment": deployment, "log": str(log_file), "env": dict(os.environ), "hold": hold}
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps(order).encode() + b"\n")
                self.proc.stdin.flush()
                if hold:
                    self.held_for = deployment
                else:
                    self.proc.stdin.close()
                self._release()
                return self.proc
            except BrokenPipeError:  # it died between the poll and the write
                pass
        self.discard()
        return None

    def go(self) -> subprocess.Popen | None:
        """The held worker, now running its deployment's suites; None when it died meanwhile."""
        assert self.proc.stdin is not None and self.held_for is not None
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"go\n")
                self.proc.stdin.close()
                return self.proc
            except BrokenPipeError:
                pass
        self.discard()
        return None

    def discard(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # a line it never read
                self.proc.stdin.close()
        self._release()

    def _release(self) -> None:
        if self._terminal >= 0:
            os.close(self._terminal)
            self._terminal = -1
        self._output.close()


def wait_for_order(engine: str) -> dict | None:
    """The warm worker's side: import the engine's library, then read the order; None when the driver closed
    the pipe without one. An import that fails is left to the engine's own load, which says it in one line."""
    import importlib
    import time

    from evalkit.engines import engine_spec

    start = time.perf_counter()
    modules = engine_spec(engine).warm_imports
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception:  # the real load reports it
        pass
    print(f"{STARTED_EARLY}: imported {', '.join(modules)} in {time.perf_counter() - start:.1f} s "
          "before its deployment's turn", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return None
    order = json.loads(line)
    _output_to(Path(order["log"]))
    progress_fd = os.environ.get("EVALKIT_PROGRESS_FD")
    os.environ.clear()
    os.environ.update(order["env"])  # the driver's environment now, as a worker started now would have it
    if progress_fd is not None:
        os.environ["EVALKIT_PROGRESS_FD"] = progress_fd
    return order


@contextlib.contextmanager
def loading_for_later() -> Iterator[None]:
    """Engines loaded inside size their threads to run alone (`hardware.engine_threads`): the work beside a
    held worker ends before its engine computes."""
    from evalkit.hardware import LOADING_FOR_LATER

    os.environ[LOADING_FOR_LATER] = "1"
    try:
        yield
    finally:
        os.environ.pop(LOADING_FOR_LATER, None)


def load_then_wait(engine: Any) -> None:
    """The held worker's side, inside `loading_for_later` (which it ends): load the real engine now (a LazyEngine
    loads on its first model call), then wait for the driver's go; `NotHanded` when the pipe closes without one."""
    from evalkit.hardware import LOADING_FOR_LATER

    real = getattr(engine.uncached(), "real", None)
    if callable(real):
        real()
    os.environ.pop(LOADING_FOR_LATER, None)
    print(f"{STARTED_EARLY}: engine loaded, waiting for its deployment's turn", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip() != "go":
        raise NotHanded


class NotHanded(Exception):
    """The driver discarded a held worker: it exits without running anything."""


def _output_to(log_file: Path) -> None:
    """Append what was printed while waiting to `log_file`, then send stdout and stderr there."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.lseek(1, 0, os.SEEK_SET)
    with log_file.open("ab") as log:
        while chunk := os.read(1, 1 << 16):
            log.write(chunk)
        log.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
