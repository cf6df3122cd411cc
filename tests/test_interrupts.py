"""Ctrl-C where Python cannot raise it (evalkit.interrupts): in llama.cpp's Python callback, in a destructor.
Each case runs in a child process.

The child makes llama.cpp's log callback send the process SIGINT the first time it runs, during a vocabulary-only
load of the real SmolLM2 GGUF, so the signal's handler runs inside the callback, the window where ctypes used to
swallow the KeyboardInterrupt. Through evalkit (load_llama_cpp installs the hook) KeyboardInterrupt comes, in
the load or the moment it returns; through llama_cpp imported bare, the control, the interrupt is lost: the load
completes and two seconds pass without it.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_module

CHILD = r"""
import ctypes, os, signal, sys, time
if sys.argv[1] == "evalkit":
    from evalkit.engines.llamacpp_lib import load_llama_cpp
    llama_cpp = load_llama_cpp()
else:
    import llama_cpp
sent = []

@llama_cpp.llama_log_callback
def ctrl_c_once(level, text, user_data):
    if not sent:
        sent.append(text)
        os.kill(os.getpid(), signal.SIGINT)

llama_cpp.llama_log_set(ctrl_c_once, ctypes.c_void_p(0))
try:
    llama_cpp.Llama(model_path=sys.argv[2], vocab_only=True, verbose=False)
    time.sleep(2)  # the interrupt may come back a few milliseconds after the load returned
except KeyboardInterrupt:
    print("interrupted" if sent else "interrupted, but not from the callback")
    sys.exit(0)
print("loaded" if sent else "loaded, and the callback never ran")
"""


def _child(how: str, gguf: Path) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, how, str(gguf)], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.engine
@pytest.mark.parametrize("how, outcome", [("evalkit", "interrupted"), ("bare llama_cpp", "loaded")])
def test_ctrl_c_inside_a_llama_cpp_callback_interrupts_the_load(how: str, outcome: str, smollm_gguf: Path) -> None:
    require_module("llama_cpp", "llama.cpp engine")
    assert _child(how, smollm_gguf) == outcome


def test_other_unraisable_errors_still_reach_the_hook_that_was_there() -> None:
    """Only KeyboardInterrupt is taken: an error in a destructor is still printed by Python's own hook."""
    child = ("from evalkit.interrupts import keep_interrupts\n"
             "keep_interrupts()\n"
             "class Broken:\n"
             "    def __del__(self):\n"
             "        raise ValueError('from a destructor')\n"
             "Broken()\n"
             "print('went on')\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == "went on", done.stderr
    assert "Exception ignored in" in done.stderr and "ValueError: from a destructor" in done.stderr


DESTRUCTOR_CHILD = r"""
import os, signal, sys, time
if sys.argv[1] == "evalkit":
    from evalkit.interrupts import keep_interrupts
    keep_interrupts()

class SendsCtrlC:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, inside the destructor

try:
    SendsCtrlC()
    time.sleep(2)
except KeyboardInterrupt:
    print("interrupted")
    sys.exit(0)
print("went on")
"""


@pytest.mark.parametrize("how, outcome", [("evalkit", "interrupted"), ("bare Python", "went on")])
def test_ctrl_c_inside_a_destructor_interrupts_the_code_after_it(how: str, outcome: str) -> None:
    """The garbage collector may run a destructor at any bytecode, so Ctrl-C can land in one anywhere; Python
    alone, the control, prints "Exception ignored" and goes on."""
    done = subprocess.run([sys.executable, "-c", DESTRUCTOR_CHILD, how], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.strip() == outcome, done.stderr
