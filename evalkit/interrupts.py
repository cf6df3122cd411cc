"""Ctrl-C is not lost where Python cannot raise it.

Python runs a signal's handler in the main thread at its next bytecode. When that bytecode belongs to a ctypes
callback (llama.cpp's log callback runs many times while a model loads) or to a destructor run by the garbage
collector, the handler's KeyboardInterrupt cannot unwind the code that was interrupted: Python reports it as
"unraisable" and goes on. So the interrupt was gone, and a worker ran its whole deployment after the user
pressed Ctrl-C.

Here the interrupt is pending from the moment such a report arrives (sys.unraisablehook) until a handler has
raised it again. A watcher thread interrupts the main thread every 10 ms while it is pending (a real SIGINT every
tenth time: it wakes a blocking system call, but also breaks a C library's reads); the SIGINT handler clears it
and raises, except inside the hook itself, where the raise would be lost the same way: there it leaves it
pending, and the next try comes after the hook has returned. A raise that lands in a callback again is reported
again and stays pending; one that lands in ordinary code unwinds, as Ctrl-C should.
"""
from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

_AGAIN_S = 0.01
_SIGNAL_EVERY = 10  # tries
_pending = threading.Event()
_installed = False


def keep_interrupts() -> None:
    """Install the hook, the handler and the watcher (once per process, from its main thread; a SIGINT handler
    other than Python's default, or SIG_IGN, is left alone; other unraisable reports go on to the hook that was
    there)."""
    global _installed
    main = threading.main_thread()
    if _installed or threading.current_thread() is not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    previous = sys.unraisablehook

    def hook(report: Any) -> None:
        if isinstance(report.exc_value, KeyboardInterrupt):
            _pending.set()
        else:
            previous(report)

    def inside(frame: FrameType | None, code: CodeType) -> bool:
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if inside(frame, hook.__code__):
            return  # stays pending: raised again once the hook has returned
        _pending.clear()
        raise KeyboardInterrupt

    def watch() -> None:
        assert main.ident is not None
        while True:
            _pending.wait()
            tries = 0
            while True:
                time.sleep(_AGAIN_S)
                if not _pending.is_set():
                    break
                tries += 1
                if tries % _SIGNAL_EVERY:
                    _thread.interrupt_main()  # runs the handler at the main thread's next bytecode, no EINTR in C code
                else:  # a real signal now and then: it also wakes a main thread blocked in a system call
                    signal.pthread_kill(main.ident, signal.SIGINT)

    sys.unraisablehook = hook
    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=watch, name="evalkit-interrupts", daemon=True).start()
    _installed = True
