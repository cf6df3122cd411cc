"""Run a command with SIGINT, SIGQUIT, SIGPIPE and SIGXFSZ at their defaults.

    python3 tests/with_default_signals.py CMD [ARG...]

A shell starts a background job (`... &`, no job control) with SIGINT and SIGQUIT ignored; the ignoring survives
exec and bash cannot undo it, so a make test started that way never lets its Ctrl-C test interrupt `evalkit run`.
Python itself ignores SIGPIPE and SIGXFSZ, which exec would pass on too. test_served's Ctrl-C test starts `evalkit
run` through this, and the benchmark scripts their runs.
"""
import os
import signal
import sys

for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(number, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])
