"""The local executor: one subprocess per deployment, one after another (a deployment is one unit here:
shards would only load the same engine again on the same machine)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from evalkit.executors.provenance import record_execution
from evalkit.store import RunDir


class LocalExecutor:
    kind = "local"

    def run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        """The engines' own output (vLLM's and llama.cpp's logs, from Python and from C code, in the worker and
        in vLLM's child processes) goes to logs/<deployment>.log; evalkit's progress reaches the terminal
        through a duplicate of our stderr handed to the worker (EVALKIT_PROGRESS_FD)."""
        from evalkit.executors.order import dependencies, dependency_order
        from evalkit.progress import RunProgress, pending_by_suite

        # A deployment that reads another's artefacts (the KLD reference's stored distributions) runs after it.
        names = dependency_order(names, dependencies(run, names))
        record_execution(run, {"kind": self.kind, "hostname": platform.node()})
        RunProgress.start(run.path, {n: pending_by_suite(run, n) for n in names})
        logs = run.path / "logs"
        logs.mkdir(exist_ok=True)
        codes: dict[str, int] = {}
        for name in names:
            log_file = logs / f"{name}.log"
            print(f"evalkit: running deployment {name} (engine log: {log_file})", file=sys.stderr, flush=True)
            terminal = os.dup(sys.stderr.fileno())
            env = {**os.environ, "EVALKIT_PROGRESS_FD": str(terminal)}
            try:
                with log_file.open("ab") as log:
                    proc = subprocess.run([sys.executable, "-m", "evalkit.worker", str(run.path), name], env=env,
                                          stdout=log, stderr=log, pass_fds=(terminal,))
            finally:
                os.close(terminal)
            codes[name] = proc.returncode
            if proc.returncode != 0:
                print(f"evalkit: deployment {name} failed (exit {proc.returncode}); its finished items are kept; "
                      f"last lines of {log_file}:\n{_tail(log_file)}", file=sys.stderr)
        return codes


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_bytes()[-8192:].decode("utf-8", errors="replace")
    return "\n".join("    " + ln for ln in text.strip().splitlines()[-lines:])
