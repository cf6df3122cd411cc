"""The local executor: one subprocess per deployment, one after another (a deployment is one unit here:
shards would only load the same engine again on the same machine)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

from evalkit.executors import record_execution
from evalkit.store import RunDir


class LocalExecutor:
    kind = "local"

    def run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        record_execution(run, {"kind": self.kind, "hostname": platform.node()})
        codes: dict[str, int] = {}
        for name in names:
            print(f"evalkit: running deployment {name}", file=sys.stderr, flush=True)
            env = os.environ.copy()
            env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the terminal for evalkit's progress bars
            proc = subprocess.run([sys.executable, "-m", "evalkit.worker", str(run.path), name], env=env)
            codes[name] = proc.returncode
            if proc.returncode != 0:
                print(f"evalkit: deployment {name} failed (exit {proc.returncode}); its finished items are kept", file=sys.stderr)
        return codes
