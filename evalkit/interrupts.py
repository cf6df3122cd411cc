"""Ctrl-C is not lost where Python cannot raise it.

Python runs a signal's handler in the main thread at its next bytecode. When that bytecode belongs to a ctypes
callback (llama.cpp's log callback runs many times while a model loads) or to a destructor run by the garbage
collector, the handler's KeyboardInterrupt cannot unwind the code that was interrupted: Python reports it as
"unraisable" and goes on. So the interrupt was gone, and a worker ran its whole deployment after the user
pressed Ctrl-C. The hook installed here sees such a report and signals the main thread again a few milliseconds
later (from a timer thread: an interrupt raised while the hook itself runs would be lost the same way), again
while it keeps landing in callbacks, until it lands in ordinary code, where KeyboardInterrupt unwinds.
"""
from __future__ import annotations

import signal
import sys
import threading
from typing import Any

_installed = False
_AGAIN_S = 0.005


def keep_interrupts() -> None:
    """Install the hook (once per process; other unraisable reports go on to the hook that was there)."""
    global _installed
    if _installed:
        return
    previous = sys.unraisablehook
    main = threading.main_thread().ident
    assert main is not None

    def interrupt_main() -> None:  # a real signal: it also wakes a main thread blocked in a system call
        signal.pthread_kill(main, signal.SIGINT)

    def hook(report: Any) -> None:
        if isinstance(report.exc_value, KeyboardInterrupt):
            try:
                again = threading.Timer(_AGAIN_S, interrupt_main)
                again.daemon = True
                again.start()
            except KeyboardInterrupt:  # a second Ctrl-C while the timer started: that one is the retry
                pass
            return
        previous(report)

    sys.unraisablehook = hook
    _installed = True
