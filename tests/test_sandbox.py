"""The sandbox against hostile code: every attack is contained, scored as a failure, and the session goes on."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from conftest import unavailable
from evalkit import sandbox
from evalkit.sandbox import extract_code, run_tests

ISO = sandbox.isolation()
NEEDS_UID = pytest.mark.usefixtures("own_uid")
NEEDS_NS = pytest.mark.usefixtures("namespaces")


@pytest.fixture
def own_uid() -> None:
    if ISO.uid is None:  # not root, or setpriv/unshare missing
        unavailable("sandbox uid separation", f"isolation {ISO.name!r} runs code as our own uid (needs root + setpriv)")


@pytest.fixture
def namespaces() -> None:
    if "namespaces" not in ISO.name and ISO.name != "user-namespace":
        unavailable("sandbox namespaces", f"isolation {ISO.name!r} has no network/PID namespace (needs unshare)")


@pytest.fixture
def private_tmpfs() -> None:
    if "tmpfs" not in ISO.name:
        unavailable("sandbox tmpfs", f"isolation {ISO.name!r} has no private tmpfs (needs unshare as root)")


def _leftovers() -> list[int]:
    """Processes still running in a sandbox work directory that has been deleted (escaped the cleanup)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if "evalkit-sandbox-" in cwd and cwd.endswith("(deleted)"):
            out.append(int(pid))
    return out


def _no_leftovers(wait_s: float = 3.0) -> bool:
    deadline = time.monotonic() + wait_s
    while _leftovers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# --- correct and wrong code ---

def test_correct_solution_passes():
    r = run_tests("def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n", "add")
    assert (r.passed, r.status, r.detail) == (True, "passed", "")
    assert r.duration_s < 5


def test_wrong_solution_fails_with_the_assertion():
    r = run_tests("def add(a, b):\n    return a - b\n", "assert add(0, 0) == 0\nassert add(1, 2) == 3\n", "add")
    assert (r.passed, r.status) == (False, "failed")
    assert "AssertionError" in r.detail and "line 2" in r.detail and "add(1, 2) == 3" in r.detail


def test_humaneval_check_function_is_called_with_the_entry_point():
    tests = "def check(candidate):\n    assert candidate(2) == 4, 'square'\n"
    assert run_tests("def sq(x):\n    return x * x\n", tests, "sq").passed
    r = run_tests("def sq(x):\n    return x + x + 1\n", tests, "sq")
    assert r.status == "failed" and "square" in r.detail


def test_missing_entry_point_and_syntax_error_are_errors():
    assert run_tests("def other():\n    pass\n", "assert True\n", "add").status == "error"
    r = run_tests("def add(a, b) return a\n", "assert add(1, 2)\n", "add")
    assert r.status == "error" and "SyntaxError" in r.detail


def test_early_exit_or_forged_report_is_not_a_pass():
    # the verdict needs the nonce on the private fd: exiting 0 or writing "passed" everywhere is an error
    forge = "import os\nfor fd in range(1, 30):\n    try:\n        os.write(fd, b'x passed\\n')\n    except OSError:\n        pass\nos._exit(0)\n"
    for code in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n", forge):
        r = run_tests(code, "assert add(1, 2) == 3\n", "add")
        assert not r.passed and r.status == "error", (code, r)


# --- hostile code ---

def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run_tests("def f():\n    while True:\n        pass\n", "assert f()\n", "f", timeout_s=1.5)
    assert (r.passed, r.status) == (False, "timeout")
    assert time.monotonic() - t < 6
    assert _no_leftovers()


def test_fork_bomb_is_contained():
    t = time.monotonic()
    r = run_tests("import os\nwhile True:\n    os.fork()\n", "assert True\n", None, timeout_s=3)
    assert not r.passed and r.status in ("error", "timeout", "killed")
    # the persistent kind: swallows the fork errors and keeps every process spinning until the timeout
    stubborn = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_tests(stubborn, "assert True\n", None, timeout_s=2)
    assert (r.passed, r.status) == (False, "timeout")
    assert time.monotonic() - t < 15
    assert _no_leftovers(), "forked processes survived the run"


@NEEDS_NS
def test_processes_that_leave_the_group_die_with_the_run():
    code = "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n    return True\n"
    assert run_tests(code, "assert f()\n", "f", timeout_s=5).passed
    assert _no_leftovers(), "a setsid() child outlived the sandbox"



def test_a_zombie_in_the_group_does_not_hold_up_the_kill():
    """The group's last member a zombie (our child, exited, not reaped yet): the kill returns at once instead of
    killing it again for its whole wait; a live member is still killed."""
    import subprocess

    zombie = subprocess.Popen(["true"], start_new_session=True)
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped: a zombie
    assert not sandbox._group_has_live_member(zombie.pid)
    t = time.monotonic()
    sandbox._kill_group(zombie.pid, wait_s=30)
    assert time.monotonic() - t < 5
    zombie.wait()
    live = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert sandbox._group_has_live_member(live.pid)
        sandbox._kill_group(live.pid, wait_s=30)
        assert live.wait(timeout=10) == -9
    finally:
        live.kill()
        live.wait()


def test_a_timed_out_program_beside_others_costs_its_timeout():
    """Two sandboxes at a time, as scoring runs them: the looping program's result comes within its timeout
    plus the kill (it took 2 s more when PID 1 reaped the killed interpreter late and the kill waited on it)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        looping = pool.submit(run_tests, "def f():\n    while True:\n        pass\n", "f()", None, timeout_s=2)
        quick = [pool.submit(run_tests, "def f():\n    return 1\n", "assert f() == 1", None, timeout_s=2) for _ in range(12)]
        assert all(q.result().passed for q in quick)
        r = looping.result()
    assert r.status == "timeout"
    assert r.duration_s < 2 + 1.5
    assert _no_leftovers()

def test_huge_allocation_fails():
    r = run_tests("def f():\n    return len(bytearray(10**11))\n", "assert f() > 0\n", "f", memory_mb=256)
    assert not r.passed and r.status in ("failed", "killed")
    assert r.status == "killed" or "MemoryError" in r.detail


def test_flood_of_output_is_capped():
    code = "def f():\n    while True:\n        print('y' * 10**6)\n"
    r = run_tests(code, "assert f()\n", "f", timeout_s=10)
    assert not r.passed and r.status in ("failed", "killed")
    assert len(r.detail) <= sandbox.DETAIL_CHARS


@NEEDS_UID
def test_cannot_write_outside_its_directory(tmp_path: Path):
    target = tmp_path / "pwned.txt"
    repo_target = Path(sandbox.__file__).parent / "pwned.txt"
    code = (
        "from pathlib import Path\n"
        "def attack(paths):\n"
        "    Path('own.txt').write_text('fine')  # its own directory is writable\n"
        "    done = []\n"
        "    for p in paths:\n"
        "        try:\n"
        "            Path(p).write_text('pwned')\n"
        "            done.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return done\n"
    )
    tests = f"done = attack([{str(target)!r}, {str(repo_target)!r}])\nassert Path('own.txt').read_text() == 'fine'\nassert done != []\n"
    r = run_tests(code, tests, "attack")
    assert (r.passed, r.status) == (False, "failed"), r
    assert "line 3" in r.detail  # the own-directory write worked; only the escapes failed
    assert not target.exists() and not repo_target.exists()


@pytest.mark.usefixtures("private_tmpfs")
def test_world_writable_dirs_are_private_and_writes_are_capped():
    name = f"evalkit-escape-{os.getpid()}.txt"
    code = (
        "def attack(name):\n"
        "    for d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
        "        open(f'{d}/{name}', 'w').write('pwned')  # succeeds, but in the sandbox's own tmpfs\n"
        "    i = 0\n"
        "    while True:  # fill the disk, 8 MB per file\n"
        "        open(f'fill{i}', 'wb').write(b'x' * (8 << 20))\n"
        "        i += 1\n"
    )
    r = run_tests(code, f"attack({name!r})\n", "attack", timeout_s=10)
    assert r.status == "failed" and "No space left on device" in r.detail, r
    assert not any(Path(d, name).exists() for d in ("/tmp", "/var/tmp", "/dev/shm"))


@NEEDS_NS
def test_cannot_reach_the_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    port = server.getsockname()[1]
    # both the ordinary socket module and a freshly re-imported _socket (which bypasses the in-process guard)
    code = (
        "import socket, sys\n"
        "def attack(port):\n"
        "    got = []\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=2)\n"
        "        got.append('socket')\n"
        "    except OSError:\n"
        "        pass\n"
        "    sys.modules.pop('_socket', None)\n"
        "    import _socket\n"
        "    try:\n"
        "        s = _socket.socket()\n"
        "        s.settimeout(2)\n"
        "        s.connect(('127.0.0.1', port))\n"
        "        got.append('_socket')\n"
        "    except OSError:\n"
        "        pass\n"
        "    return got\n"
    )
    try:
        r = run_tests(code, f"assert attack({port}) != []\n", "attack", timeout_s=8)
        assert (r.passed, r.status) == (False, "failed"), r
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_python_level_socket_guard():
    code = "import socket\ndef f():\n    socket.socket()\n"
    r = run_tests(code, "f()\n", "f")
    assert r.status == "failed" and "network access is disabled" in r.detail


def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("EVALKIT_TEST_SECRET", "hunter2")
    code = (
        "import os\n"
        "def leak(ppid):\n"
        "    found = [os.environ.get('EVALKIT_TEST_SECRET', '')]\n"
        "    for pid in (ppid, os.getppid()):\n"
        "        try:\n"
        "            found.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'hunter2' in ' '.join(found)\n"
    )
    r = run_tests(code, f"assert leak({os.getpid()})\n", "leak")
    assert (r.passed, r.status) == (False, "failed"), r


# --- extraction ---

def test_extract_fenced_python_block():
    out = "Sure! Here it is:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nThis adds two numbers."
    assert extract_code(out) == "def add(a, b):\n    return a + b\n"


def test_extract_prefers_block_defining_the_entry_point():
    out = "Usage:\n```\nprint(add(1, 2))\n```\nCode:\n~~~python\ndef add(a, b):\n    return a + b\n~~~\n"
    assert extract_code(out, entry_point="add") == "def add(a, b):\n    return a + b\n"
    assert extract_code(out) == "print(add(1, 2))\n"  # no entry point known: the first block


def test_extract_skips_non_python_blocks_and_reads_unclosed_fences():
    out = "```bash\npip install nothing\n```\n```py\ndef f():\n    return 1\n```"
    assert extract_code(out) == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # cut by max_tokens


def test_extract_bare_and_prose_wrapped_code():
    code = "import math\n\ndef area(r):\n    return math.pi * r * r\n"
    assert extract_code(code) == code
    wrapped = "Here is the solution to your problem:\n\n" + code + "\nThis function computes the area of a circle.\n"
    got = extract_code(wrapped)
    assert got.strip() == code.strip()
    assert run_tests(got, "assert abs(area(1) - 3.14159) < 1e-4\n", "area").passed


def test_extract_humaneval_completion_joins_prompt_and_body():
    prompt = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n'
    body = "    return sum(xs)\n\n\ndef unrelated():\n    pass\n\nThe function above sums the list.\n"
    code = extract_code(body, prompt=prompt)
    assert code.startswith(prompt) and "return sum(xs)" in code and "The function above" not in code
    assert run_tests(code, "def check(candidate):\n    assert candidate([1, 2]) == 3\n", "total").passed


def test_extract_full_function_keeps_prompt_imports():
    prompt = "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n"
    out = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"
    code = extract_code(out, prompt=prompt)
    assert code == "from typing import List\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n"
    assert run_tests(code, "assert total([2, 2]) == 4\n", "total").passed


def test_extract_completion_that_closes_an_imagined_fence():
    prompt = "def neg(x: int) -> int:\n    \"\"\"-x\"\"\"\n"
    for out in ("    return -x\n```\n\nThis negates x.\n", "```\n\nIn this implementation we negate.", "```python\n    return -x\n```"):
        code = extract_code(out, prompt=prompt)
        assert code.startswith(prompt), out
        ok = run_tests(code, "assert neg(3) == -3\n", "neg").passed
        assert ok == ("return -x" in out), (out, code)


def test_kept_verdicts_are_read_back_and_timeouts_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A re-score reads a program's own verdict from the memo (the program does not run again); a timeout depends
    on the machine's load and runs again."""
    memo = tmp_path / "sandbox"
    ok = run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2", "f", timeout_s=5, memo=memo)
    bad = run_tests("def f(x):\n    return x\n", "assert f(1) == 2, 'off by one'", "f", timeout_s=5, memo=memo)
    slow = run_tests("def f(x):\n    while True: pass\n", "f(1)", "f", timeout_s=0.5, memo=memo)
    assert (ok.status, bad.status, slow.status) == ("passed", "failed", "timeout")
    assert len([p for p in memo.glob("*.json") if p.name != sandbox.PROBE_FILE]) == 2

    def no_run(*a, **k):
        raise AssertionError("ran again")

    monkeypatch.setattr(sandbox, "_execute", no_run)
    # A fresh process (no isolation probed yet) reads kept verdicts without probing: the probe runs a program.
    monkeypatch.setattr(sandbox, "_isolation", None)
    assert run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2", "f", timeout_s=5, memo=memo) == ok
    assert run_tests("def f(x):\n    return x\n", "assert f(1) == 2, 'off by one'", "f", timeout_s=5, memo=memo) == bad
    with pytest.raises(AssertionError, match="ran again"):  # another limit is another key
        run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2", "f", timeout_s=6, memo=memo)
    with pytest.raises(AssertionError, match="ran again"):
        run_tests("def f(x):\n    while True: pass\n", "f(1)", "f", timeout_s=0.5, memo=memo)
