"""Answers kept on disk by the hash of the question: a pure computation (a drawn figure) is done
once and read back bit for bit by every later run that asks the same question. A full or read-only directory
costs the memo, never the answer."""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from evalkit.fileio import atomic_write_bytes


class Memo:
    """One kind of kept answer (`suffix`: the files' extension), kept only inside a `kept_under` block."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.where: Path | None = None

    @contextmanager
    def kept_under(self, where: Path | None) -> Iterator[None]:
        """Keep answers under `where` (None: compute every one) for the calls made inside the block."""
        before, self.where = self.where, where
        try:
            yield
        finally:
            self.where = before

    def answer(self, key: Callable[[], str], compute: Callable[[], bytes],
               usable: Callable[[bytes], bool] = lambda _: True) -> bytes:
        """compute(), or the bytes kept for key() when `usable` accepts them. The key is built only when
        answers are kept (it can be long: a bootstrap's samples)."""
        if self.where is None:
            return compute()
        path = self.where / f"{hashlib.sha256(key().encode('utf-8')).hexdigest()}{self.suffix}"
        try:
            kept = path.read_bytes()
            if usable(kept):
                return kept
        except OSError:
            pass
        fresh = compute()
        try:
            atomic_write_bytes(path, fresh)
        except OSError:
            pass
        return fresh
