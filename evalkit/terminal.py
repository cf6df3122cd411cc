"""The user's terminal, seen from a worker process.

The local executor hands a worker its terminal as a file descriptor (EVALKIT_PROGRESS_FD) and sends the
worker's own stdout and stderr to the engine log, with everything vLLM and llama.cpp print there. Progress
bars and the few lines a user must see (an error, a tokenization difference) go to the terminal; `say` puts
a line on both, so the engine log tells the whole story too."""
from __future__ import annotations

import os
import sys
from typing import TextIO


def _terminal() -> TextIO:
    fd = os.environ.get("EVALKIT_PROGRESS_FD")
    if fd:
        try:
            return os.fdopen(int(fd), "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        except (OSError, ValueError):
            pass
    return sys.stderr


TERMINAL = _terminal()


def say(line: str) -> None:
    """One line to the user's terminal and to the engine log (which may sit on a disk that is full)."""
    if TERMINAL is not sys.stderr:
        print(line, file=TERMINAL, flush=True)
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
