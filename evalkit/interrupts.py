"""Ctrl-C that arrives while C code calls back into Python is not lost.

Python runs a signal's handler in the main thread at its next bytecode, which while llama.cpp loads a model is
usually inside a ctypes callback (llama.cpp's log callback, evalkit's load-log reader). The handler's
KeyboardInterrupt then ends the callback, and ctypes reports it as unraisable and goes on: the interrupt was
gone, and the worker ran its whole deployment after the user pressed Ctrl-C. The hook installed here sees that
report and interrupts the main thread again a few milliseconds later (from a timer thread: an interrupt
raised while the hook itself runs would be lost the same way), again and again while it lands in callbacks,
until the C call has returned and it lands in the code that called it, where KeyboardInterrupt unwinds.
"""
from __future__ import annotations

import signal
import sys
import threading
from typing import Any

_installed = False
_AGAIN_S = 0.005


def keep_interrupts_from_callbacks() -> None:
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
