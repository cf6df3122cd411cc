"""Executors: where units of work run. `local` runs each deployment in its own subprocess, one after
another; `ray` runs units as Ray tasks with the resources their deployments declare and streams records
back to the driver, the only writer. Both run a unit with `evalkit.worker.run_unit`.

Importing this package never imports Ray.
"""
from __future__ import annotations

import importlib
from typing import Protocol

from evalkit.store import RunDir


class Executor(Protocol):
    kind: str

    def run(self, run: RunDir, names: list[str]) -> dict[str, int]:
        """Run every unit of the named deployments; 0 per deployment that ran to the end, else non-zero.
        A failing deployment never stops the others."""


def make_executor(kind: str, address: str | None = None, max_attempts: int = 3, namespace: str = "evalkit") -> Executor:
    if kind == "local":
        from evalkit.executors.local import LocalExecutor

        return LocalExecutor()
    if kind == "ray":
        try:
            importlib.import_module("ray")  # installed, and importable here
        except ImportError:
            from evalkit.errors import EngineUnavailableError

            raise EngineUnavailableError("--executor ray", "Ray is not installed (pip install 'evalkit[ray]', or make install)") from None
        from evalkit.executors.ray import RayExecutor

        return RayExecutor(address=address, max_attempts=max_attempts, namespace=namespace)
    raise ValueError(f"unknown executor {kind!r}")
