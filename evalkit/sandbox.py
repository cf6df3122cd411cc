"""Run untrusted, model-written Python against tests, contained, and say whether it passed.

Threat model: model output is untrusted and may be careless or destructive by accident (infinite
loops, huge allocations, fork loops, writes anywhere, network calls, megabytes of output, `sys.exit()`
at import). It must not hang or starve the machine, modify anything outside its own throw-away
directory, reach the network, see our environment (API tokens), or be scored as passing without the
tests really passing. Out of scope: code crafted to escape Linux namespaces or to forge the result by
digging the report nonce out of the harness's own memory (or by returning objects that equal anything).

Layers, strongest first (`isolation()` probes once which ones this machine supports):
- `unshare` namespaces: no network (empty net namespace), own PID namespace (when its init exits or is
  killed, every process the code forked dies: fork loops cannot outlive the run), own mount/IPC.
- a different, unprivileged uid (`nobody` via `setpriv`, when we are root): file permissions protect
  the repo, run directories and /root. In the mount namespace the world-writable directories (/tmp,
  /var/tmp, /dev/shm, /run/lock) are private tmpfs and the work dir lives on a 64 MB tmpfs: the code
  can write nowhere on the host and cannot fill the disk. It can still read world-readable files.
- rlimits set by the harness before the code is loaded (not in preexec_fn, which is unsafe in threaded
  parents): address space, CPU time, processes (RLIMIT_NPROC is per uid, so it only bites once the
  uid is not root), file size (also caps captured output), open files, no core dumps.
- a wall-clock timeout that SIGKILLs the whole process group; `python -I -S` (standard library only)
  with a minimal env. The interpreter is the first one the sandbox uid can fully read.
- defence in depth only: sockets raise inside the interpreter (bypassable, e.g. by re-importing
  `_socket`; the network namespace is what really holds).
The verdict travels on a private file descriptor, prefixed by a per-run nonce and backed by the exit
code, so an early `os._exit(0)` or stray output is an error, never a pass.
"""
from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "timeout", "error", "killed")
DETAIL_CHARS = 300
MAX_PROCS = 16  # threads count too; HumanEval-style code needs neither
FILE_MB = 16  # also caps captured stdout/stderr
MAX_FILES = 64

# --- the harness that runs inside the sandbox ---------------------------------------------------
# evalkit/sandbox_runner.py, a program of its own (standard library only): its source is passed with -c, so the
# sandbox's uid needs no access to evalkit's files.
_RUNNER = (Path(__file__).with_name("sandbox_runner.py")).read_text(encoding="utf-8")

_SIGNALS = {
    "SIGKILL": "killed (CPU time hard limit or out of memory)",
    "SIGXCPU": "CPU time limit exceeded",
    "SIGXFSZ": "file size limit exceeded (too much output?)",
    "SIGSEGV": "crashed (segmentation fault)",
}


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # one of STATUSES
    detail: str  # short: the failing assertion, the error, or the tail of the output
    duration_s: float


@dataclass(frozen=True)
class Isolation:
    """How sandboxed code runs on this machine (found by probing, see `isolation()`)."""

    name: str  # "namespaces+tmpfs+uid", "namespaces+uid", "uid", "user-namespace" or "process-group"
    prefix: tuple[str, ...]  # command that wraps the interpreter
    python: str
    uid: int | None  # the uid the code runs as when we drop privileges (we are root)
    gid: int | None

    def describe(self) -> dict[str, object]:
        return {"isolation": self.name, "python": self.python, "uid": self.uid}


# --- extraction ---------------------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]*(?P<f>```|~~~)[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)^[ \t]*(?P=f)[ \t]*$", re.M | re.S)
_OPEN_FENCE = re.compile(r"^[ \t]*(?:```|~~~)[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*)\Z", re.M | re.S)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
_CODE_START = re.compile(r"^(?:async\s+def|def|class|import|from|if\s+__name__)\b|^@")
_DEF = r"^[ \t]*(?:async\s+)?def\s+{}\s*\("


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # untrusted text: any parse failure is "no"
        return False


def _defines(code: str, name: str) -> bool:
    return re.search(_DEF.format(re.escape(name)), code, re.M) is not None


def _entry_from_prompt(prompt: str | None) -> str | None:
    names = re.findall(r"^def\s+(\w+)\s*\(", prompt or "", re.M)
    return names[-1] if names else None


def _fenced_blocks(output: str) -> list[str]:
    """Bodies of Python (or untagged) fenced blocks, as written (not dedented)."""
    blocks = [m.group("body") for m in _FENCE.finditer(output) if m.group("lang").lower() in _PY_LANGS]
    if not blocks and not _FENCE.search(output):
        m = _OPEN_FENCE.search(output)  # a block cut off by max_tokens, if what follows looks like code
        if m and m.group("lang").lower() in _PY_LANGS and any(_CODE_START.match(x) for x in m.group("body").splitlines()):
            blocks = [m.group("body")]
    return blocks


def _before_fence(output: str) -> str:
    m = re.search(r"^[ \t]*(?:```|~~~)", output, re.M)
    return output[: m.start()] if m else output


def _bare_code(output: str) -> str:
    """Code from unfenced text: drop leading prose and, if needed, trailing prose."""
    if _parses(output):
        return output
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if _CODE_START.match(line)][:5]
    for s in starts:
        # cut before each unindented line that does not look like code (trailing prose), longest first
        ends = [len(lines)] + [e for e in range(len(lines) - 1, s, -1) if lines[e] and not lines[e][0].isspace()
                               and not _CODE_START.match(lines[e])][:40]
        for e in ends:
            chunk = "\n".join(lines[s:e]).rstrip() + "\n"
            if _parses(chunk):
                return chunk
    return "\n".join(lines[starts[0]:]) + "\n" if starts else output


def _complete(prompt: str, completion: str) -> str:
    """Prompt + completion; if that does not parse, stop the completion at its first unindented line."""
    code = prompt + completion
    if _parses(code):
        return code
    lines = completion.split("\n")
    for i, line in enumerate(lines[1:], start=1):
        if line and not line[0].isspace():
            cut = prompt + "\n".join(lines[:i]) + "\n"
            if _parses(cut):
                return cut
            break
    return code


def _prompt_imports(prompt: str) -> str:
    return "".join(line + "\n" for line in prompt.splitlines() if re.match(r"(?:import|from)\s+\w", line))


def extract_code(output: str, prompt: str | None = None, entry_point: str | None = None) -> str:
    """The model's code from its answer.

    The first fenced block (``` or ~~~, untagged or Python), preferring one that defines the entry
    point; else the bare code with prose lines around it removed. With a `prompt` (HumanEval-style
    completion: the model continues a signature) the prompt is put in front when the answer does not
    define the function itself, and the prompt's imports are kept when it does.
    `entry_point` defaults to the last function the prompt defines.
    """
    entry = entry_point or _entry_from_prompt(prompt)
    blocks = _fenced_blocks(output)
    defining = [b for b in blocks if entry and _defines(b, entry)]
    if prompt is None or not entry:
        chosen = defining[0] if defining else blocks[0] if blocks else None
        return textwrap.dedent(chosen) if chosen is not None else _bare_code(output)
    imports = _prompt_imports(prompt)  # e.g. `from typing import List` used by the annotations
    if defining:
        return imports + textwrap.dedent(defining[0])
    # a completion: the body continues the signature, often closing an imagined ``` block after it
    head = _before_fence(output)
    if _defines(head, entry):
        return imports + _bare_code(head)
    if head.strip() or not blocks:
        return _complete(prompt, head)
    return _complete(prompt, blocks[0])  # a fenced body-only block: keep its indentation


# --- isolation probing ----------------------------------------------------------------------------

def _nobody() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


# Inside the namespaces, as root before dropping to the sandbox uid: private tmpfs over every
# world-writable directory, and the work dir moved onto a size-capped tmpfs, so the code can write
# nowhere on the host and cannot fill the disk. The host work dir stays reachable through the cwd.
_PRIVATE_TMP = """set -e
for d in /var/tmp /run/lock /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o size=1m,mode=1777,nosuid,nodev evalkit-sandbox "$d"; fi
done
mount -t tmpfs -o size={mb}m,mode=1777,nosuid,nodev evalkit-sandbox /tmp
mkdir -m 700 /tmp/work
cp solution.py tests.py /tmp/work/
chown {uid}:{gid} /tmp/work
cd /tmp/work
export HOME=/tmp/work TMPDIR=/tmp/work
exec "$@"
"""
TMPFS_MB = 64


def _candidate_prefixes() -> list[tuple[str, tuple[str, ...], int | None, int | None]]:
    unshare, setpriv, sh = shutil.which("unshare"), shutil.which("setpriv"), shutil.which("sh")
    ns = ("--mount", "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc", "--")
    out: list[tuple[str, tuple[str, ...], int | None, int | None]] = []
    if os.geteuid() == 0:
        uid, gid = _nobody()
        if setpriv:
            drop = (setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--")
            if unshare and sh:
                script = _PRIVATE_TMP.format(mb=TMPFS_MB, uid=uid, gid=gid)
                out.append(("namespaces+tmpfs+uid", (unshare, *ns, sh, "-c", script, "sandbox", *drop), uid, gid))
            if unshare:
                out.append(("namespaces+uid", (unshare, *ns, *drop), uid, gid))
            out.append(("uid", drop, uid, gid))
    elif unshare:
        # unprivileged: a user namespace lets us create the others; the code keeps our uid on the host
        out.append(("user-namespace", (unshare, "--user", "--map-current-user", *ns), None, None))
    out.append(("process-group", (), None, None))
    return out


def _candidate_pythons() -> list[str]:
    # the venv's interpreter may live where the sandbox uid cannot read (e.g. pyenv under /root)
    names = [os.environ.get("EVALKIT_SANDBOX_PYTHON"), sys.executable, os.path.realpath(sys.executable),
             getattr(sys, "_base_executable", None), "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")]
    seen: list[str] = []
    for n in names:
        if n and n not in seen and os.access(n, os.X_OK):
            seen.append(n)
    return seen


_PROBE_CODE = "import os, sys, json, math, re, collections, itertools, heapq, typing, hashlib\nos.stat(sys.executable)  # readable by us, so its stdlib is too\ndef f():\n    return sys.version_info[:2]\n"
_PROBE_TESTS = "assert f() >= (3, 10)\n"
_lock = threading.Lock()
_isolation: Isolation | None = None


def isolation() -> Isolation:
    """The strongest isolation that really works here, probed once by running a tiny test in it."""
    global _isolation
    with _lock:
        if _isolation is None:
            _isolation = _probe()
        return _isolation


def _probe() -> Isolation:
    tried = []
    for name, prefix, uid, gid in _candidate_prefixes():
        for python in _candidate_pythons():
            iso = Isolation(name, prefix, python, uid, gid)
            result = _execute(iso, _PROBE_CODE, _PROBE_TESTS, "f", 20.0, 256)
            if result.passed:
                if name in ("uid", "process-group"):
                    log.warning("sandbox: using weaker isolation %r (%s)", name,
                                "no network namespace" if name == "uid" else "code runs as our own user")
                return iso
            tried.append(f"{name}/{python}: {result.status} {result.detail}")
    raise RuntimeError("no working sandbox: " + "; ".join(tried))


# --- running --------------------------------------------------------------------------------------

def _clean(text: str) -> str:
    """Untrusted text made short and printable."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    text = "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)
    text = " ".join(text.split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def _tail(path: Path, n: int = 4096) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - n))
        return f.read().decode("utf-8", "replace")


def _kill_group(pgid: int, wait_s: float = 2.0) -> None:
    """SIGKILL the group until no live member is left: a process mid-fork can add a member after a single kill.
    Zombies do not count: they can neither run nor fork, and one whose parent died waits for PID 1 to reap it,
    which some container inits do late (a timed-out program then cost its whole `wait_s` more)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if not _group_has_live_member(pgid):
            return
        time.sleep(0.01)


def _group_has_live_member(pgid: int) -> bool:
    """Whether a process of group `pgid` is alive (not a zombie); True where /proc cannot tell."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        state, _ppid, group = stat[stat.rfind(b")") + 2:].split(maxsplit=3)[:3]  # comm may hold spaces and ")"
        if int(group) == pgid and state != b"Z":
            return True
    return False


def run_tests(code: str, tests: str, entry_point: str | None, timeout_s: float = 10, memory_mb: int = 512,
              memo: Path | None = None) -> SandboxResult:
    """Run `code` as solution.py, then `tests` against it, in a fresh sandbox (see module docstring).

    `tests` are statements run in the solution's namespace (asserts); when they define
    `check(candidate)` (HumanEval) it is called with `entry_point`. Exceptions in the tests -> "failed",
    code that does not load or define `entry_point` -> "error".
    `memo`: a directory keeping verdicts by content (program, tests, limits, isolation and its python), so
    re-scoring the same output reads the verdict instead of running the program again. Only the program's own
    verdicts are kept (passed, failed, error): a timeout or a kill depends on how busy the machine was.
    """
    if memo is None:
        return _execute(isolation(), code, tests, entry_point, timeout_s, memory_mb)

    def kept_path(name: str, python: str) -> Path:
        key = json.dumps([VERDICT_FORMAT, code, tests, entry_point, float(timeout_s), memory_mb, name, os.path.realpath(python)])
        return memo / f"{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()}.json"

    # The isolation the last probe on this machine chose keys the lookup, so a re-score whose every verdict is
    # kept probes nothing (the probe runs a sandboxed program: 0.15-0.4 s); a miss probes, as before.
    last = _last_probe(memo)
    kept = _kept_verdict(kept_path(*last)) if last is not None else None
    if kept is not None:
        return kept
    iso = isolation()
    _keep_probe(memo, iso)
    path = kept_path(iso.name, iso.python)
    kept = _kept_verdict(path)
    if kept is not None:
        return kept
    result = _execute(iso, code, tests, entry_point, timeout_s, memory_mb)
    if result.status in KEPT_VERDICTS:
        from evalkit.fileio import atomic_write_bytes

        try:
            atomic_write_bytes(path, json.dumps(asdict(result)).encode("utf-8"))
        except OSError:  # a full or read-only cache costs the memo, not the score
            pass
    return result


def _kept_verdict(path: Path) -> SandboxResult | None:
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept["status"] in KEPT_VERDICTS:
            return SandboxResult(kept["status"] == "passed", kept["status"], str(kept["detail"]), float(kept["duration_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


PROBE_FILE = "isolation.json"  # in the verdict memo: what the last probe chose, and on what it chose it


def _probe_inputs() -> list[Any]:
    """What a probe's choice depends on besides the kernel's answer: the candidates, in order, and the kernel."""
    import platform

    return [[[name, list(prefix), python] for name, prefix, _, _ in _candidate_prefixes() for python in _candidate_pythons()],
            platform.release()]


def _last_probe(memo: Path) -> tuple[str, str] | None:
    """(isolation name, python) the last probe chose with these same candidates on this kernel, else None."""
    try:
        kept = json.loads((memo / PROBE_FILE).read_text(encoding="utf-8"))
        if kept["inputs"] == _probe_inputs():
            return str(kept["name"]), str(kept["python"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _keep_probe(memo: Path, iso: Isolation) -> None:
    from evalkit.fileio import atomic_write_bytes

    kept = {"inputs": _probe_inputs(), "name": iso.name, "python": iso.python}
    try:
        if json.loads((memo / PROBE_FILE).read_text(encoding="utf-8")) == kept:
            return
    except (OSError, ValueError):
        pass
    try:
        atomic_write_bytes(memo / PROBE_FILE, json.dumps(kept).encode("utf-8"))
    except OSError:
        pass


SANDBOX_WORKERS = 2  # concurrent sandboxes while scoring (the machine's cores are shared)


def run_programs(programs: Mapping[Any, tuple[str, str, str | None]], timeout_s: float,
                 memo: Path | None = None) -> dict[Any, SandboxResult]:
    """key -> result of run_tests(code, tests, entry_point) for each (code, tests, entry_point), SANDBOX_WORKERS
    sandboxes at a time; callers key by program so that each distinct program runs once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=SANDBOX_WORKERS) as pool:
        return dict(zip(programs, pool.map(lambda p: run_tests(p[0], p[1], p[2], timeout_s=timeout_s, memo=memo), programs.values())))


VERDICT_FORMAT = 1  # the kept verdicts' key layout: a change runs the programs again
KEPT_VERDICTS = ("passed", "failed", "error")


def verdict_memo(manifest: Mapping[str, Any] | None) -> Path | None:
    """Where scoring keeps sandbox verdicts: the result cache's `sandbox/`, for runs that use the cache."""
    if not manifest or not manifest.get("use_cache"):
        return None
    from evalkit.models import cache_dir

    return cache_dir() / "sandbox"


def _execute(iso: Isolation, code: str, tests: str, entry_point: str | None, timeout_s: float, memory_mb: int) -> SandboxResult:
    call_check = bool(entry_point) and _defines_check(tests)
    root = Path(tempfile.mkdtemp(prefix="evalkit-sandbox-"))
    start = time.monotonic()
    try:
        os.chmod(root, 0o711)  # the sandbox may pass through to its work dir, not list or open our files
        work = root / "work"
        work.mkdir(mode=0o700)
        for name, text in (("solution.py", code), ("tests.py", tests)):
            (work / name).write_bytes(text.encode("utf-8", "replace"))  # lone surrogates from JSON
            (work / name).chmod(0o444)
        if iso.uid is not None:
            os.chown(work, iso.uid, iso.gid if iso.gid is not None else -1)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
        nonce = secrets.token_hex(16)
        with (root / "output.txt").open("wb") as out, (root / "report.txt").open("wb") as rep:
            limits = [max(1, int(timeout_s + 0.999) + 1), memory_mb, MAX_PROCS, FILE_MB, MAX_FILES]
            cmd = [*iso.prefix, iso.python, "-I", "-S", "-c", _RUNNER, str(rep.fileno()),
                   *map(str, limits), entry_point or "", "1" if call_check else "0"]
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                    pass_fds=(rep.fileno(),), start_new_session=True)
            timed_out = False
            try:
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(nonce.encode() + b"\n")
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # it died already; its exit status says why
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()  # reaped first: a zombie leader would keep the group alive
                _kill_group(proc.pid)  # stragglers the code forked, when there is no PID namespace
        duration = time.monotonic() - start
        status, detail = _verdict(root, nonce, proc.returncode, timed_out, timeout_s)
        return SandboxResult(status == "passed", status, detail, duration)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _defines_check(tests: str) -> bool:
    try:
        return any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in ast.parse(tests).body)
    except SyntaxError:
        return False


def _verdict(root: Path, nonce: str, rc: int, timed_out: bool, timeout_s: float) -> tuple[str, str]:
    if timed_out:
        return "timeout", f"timed out after {timeout_s:g}s"
    report = ""
    with (root / "report.txt").open("rb") as f:
        for raw in f.read(1 << 16).decode("utf-8", "replace").splitlines():
            if raw.startswith(nonce + " "):
                report = raw[len(nonce) + 1:]
                break
    status, _, detail = report.partition(" ")
    output = _tail(root / "output.txt")
    if status == "killed":
        return "killed", _clean(_SIGNALS.get(detail, detail) + (f": {output}" if output.strip() else ""))
    if status in ("passed", "failed", "error"):
        if status == "passed" and rc != 0:
            return "error", _clean(f"reported a pass but exited with code {rc}")
        return status, _clean(detail or output)
    if rc < 0:  # no harness in between (or it was killed): our direct child died by a signal
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return "killed", _clean(_SIGNALS.get(name, name))
    return "error", _clean(f"exited with code {rc} without a result" + (f": {output}" if output.strip() else ""))
