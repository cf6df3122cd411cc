"""The harness that runs inside the sandbox (`evalkit.sandbox`): the init of the sandbox.

It forks a worker that sets the limits, loads solution.py and runs tests.py, and reports a worker's death by
signal (a PID-namespace init cannot be killed by its own rlimit signals, and `unshare` does not pass a signal
status on, hence the extra process).

This file is a program, not a library: `evalkit.sandbox` reads its source and runs it with
`python -I -S -c <source> REPORT_FD CPU_S MEM_MB NPROC FSIZE_MB NOFILE ENTRY CALL_CHECK` (the sandbox's uid may
not be able to read evalkit's files, so the source travels on the command line), the nonce on stdin. It
imports the standard library only (it runs under -I -S, possibly under another interpreter than evalkit's,
Python 3.10 at least) and never evalkit. Importing it runs nothing.
"""
from __future__ import annotations

import os
import signal
import sys


def _limits(cpu_s: int, mem_mb: int, nproc: int, fsize_mb: int, nofile: int) -> None:
    import resource as r
    for res, n in ((r.RLIMIT_CPU, cpu_s), (r.RLIMIT_AS, mem_mb << 20), (r.RLIMIT_NPROC, nproc),
                   (r.RLIMIT_FSIZE, fsize_mb << 20), (r.RLIMIT_NOFILE, nofile), (r.RLIMIT_CORE, 0)):
        r.setrlimit(res, (n, n))


def _no_network() -> None:
    import _socket
    import socket

    class NoSocket(socket.socket):
        def __init__(self, *a: object, **k: object) -> None:
            raise PermissionError("network access is disabled in the sandbox")
    for module in (socket, _socket):  # what `socket.socket(...)` and `_socket.socket(...)` find
        vars(module)["socket"] = NoSocket


def _where(e: BaseException, fname: str, src: str | None = None) -> str:
    import traceback
    msg = type(e).__name__ + (": " + str(e) if str(e) else "")
    if isinstance(e, SyntaxError) and e.filename and e.filename.endswith(fname):
        return msg
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith(fname)]
    if frames:
        f = frames[-1]
        line = (f.line or "").strip()
        if not line and src is not None and 0 < (f.lineno or 0) <= len(src.splitlines()):
            line = src.splitlines()[(f.lineno or 0) - 1].strip()
        msg += " (%s line %s: %s)" % (fname, f.lineno, line)
    return msg


def _run(entry: str, call_check: bool) -> tuple[str, str]:
    import importlib.util
    try:
        spec = importlib.util.spec_from_file_location("solution", "solution.py")
        assert spec is not None and spec.loader is not None  # a .py path always has a source loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["solution"] = mod
        spec.loader.exec_module(mod)
    except BaseException as e:
        return "error", _where(e, "solution.py")
    ns = dict(vars(mod))
    if entry and not callable(ns.get(entry)):
        return "error", "the code does not define %s()" % entry
    src = None
    try:
        with open("tests.py", encoding="utf-8") as f:
            src = f.read()
        exec(compile(src, "tests.py", "exec"), ns)
        if call_check:
            ns["check"](ns[entry])
    except BaseException as e:
        return "failed", _where(e, "tests.py", src)
    return "passed", ""


def _worker(nonce: str, rep: int, limits: list[int], entry: str, call_check: bool) -> None:
    _limits(*limits)
    _no_network()
    sys.dont_write_bytecode = True
    me = os.getpid()
    status, detail = _run(entry, call_check)
    if os.getpid() != me:
        os._exit(1)  # a fork of the worker that ran on into the harness: only the worker reports
    line = "%s %s %s\n" % (nonce, status, " ".join(detail.split())[:2000])
    os.write(rep, line.encode("utf-8", "replace"))
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    os._exit(0 if status == "passed" else 1)  # skip atexit hooks and non-daemon threads of the code


def _main() -> None:
    nonce = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    rep = int(sys.argv[1])
    limits = [int(a) for a in sys.argv[2:7]]
    entry, call_check = sys.argv[7], sys.argv[8] == "1"
    pid = os.fork()
    if pid == 0:
        _worker(nonce, rep, limits, entry, call_check)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "signal %d" % sig
        os.write(rep, ("%s killed %s\n" % (nonce, name)).encode())
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":  # `python -c <this source>` runs under the name __main__ too
    _main()
