"""Streaming exact KLD: the KLD reference and its readers running at once over a window of chunk stores."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evalkit.suites.perplexity.stores import STORE_SUFFIX

STREAM_GRACE_S = float(os.environ.get("EVALKIT_STREAM_GRACE_S", "600"))  # how long a missing peer may take to start


STREAM_POLL_S = 0.2


@dataclass
class Streaming:
    """Streaming exact KLD (`suites.perplexity.kld_window`): the KLD reference keeps at most `window` chunk
    stores on disk, waiting for room; a reader waits for each chunk to appear; once every reader has
    recorded a chunk (its records line is on disk), the chunk's store is deleted (by the reader that
    recorded it last, or by the waiting reference). Liveness is a file lock each side holds while it runs:
    a side that waits on a peer whose lock has been free for STREAM_GRACE_S stops and leaves the rest pending.
    What is lost against the stored mode: the reference's distributions themselves (scoring needs only the
    records and side files, so `evalkit report` re-scores unchanged), so a deployment added to the run later,
    or a reader re-run from scratch, needs the reference's chunks re-run too; the cache keeps none of them."""

    run_dir: Path
    store: Path
    me: str
    owner: str
    readers: list[str]
    window: int
    _lock: Any = None

    def _lock_path(self, name: str) -> Path:
        return self.store / (".writer.lock" if name == self.owner else f".reader.{name}.lock")

    def __enter__(self) -> "Streaming":
        from filelock import FileLock

        self.store.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self._lock_path(self.me))
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def _running(self, name: str) -> bool:
        from filelock import FileLock, Timeout

        lock = FileLock(self._lock_path(name), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return True
        lock.release()
        return False

    def _stored(self) -> list[Path]:
        return sorted(self.store.glob(f"chunk-*{STORE_SUFFIX}"))

    def sweep(self) -> list[Path]:
        """Delete the stores every reader has recorded; returns those still needed."""
        from evalkit.store import RunDir, record_key

        run = RunDir(self.run_dir)
        done = {r: run.done_keys(r) for r in self.readers}
        left = []
        for path in self._stored():
            key = record_key("perplexity", path.name.removesuffix(STORE_SUFFIX))
            if all(key in d for d in done.values()):
                path.unlink(missing_ok=True)
            else:
                left.append(path)
        return left

    def room_for_one(self) -> bool:
        """The reference, before storing a chunk: wait until fewer than `window` stores are on disk (False:
        the readers still owing the stored chunks have not run for STREAM_GRACE_S)."""
        return self._wait(lambda: len(self.sweep()) < self.window, self.readers)

    def wait_for(self, path: Path) -> bool:
        """A reader: wait until the reference has stored `path` (False: the reference is not running and has
        not for STREAM_GRACE_S; the chunk stays pending)."""
        return self._wait(path.is_file, [self.owner])

    def _wait(self, ready: Callable[[], bool], peers: list[str]) -> bool:
        """Poll until `ready()`; False once none of `peers` has run for STREAM_GRACE_S."""
        idle_since: float | None = None
        while not ready():
            if any(self._running(p) for p in peers):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > STREAM_GRACE_S:
                return False
            time.sleep(STREAM_POLL_S)
        return True
