"""What the run happened on: library versions, machine, accelerators (for the manifest)."""
from __future__ import annotations

import os
import platform
import sys
from typing import Any

from evalkit.versions import package_version

# evalkit's own dependencies; each engine adds its own distributions (`EngineSpec.package` and `libraries`).
LIBRARIES = ("evalkit", "sacrebleu", "numpy", "scipy", "pandas", "statsmodels", "krippendorff")


def libraries() -> tuple[str, ...]:
    """Every distribution the manifest records: the engines' (registry order), then evalkit's own."""
    from evalkit.engines import engine_names, engine_spec

    engines = [p for name in engine_names() for p in engine_spec(name).packages()]
    return tuple(dict.fromkeys([LIBRARIES[0], *engines, *LIBRARIES[1:]]))


def library_versions() -> dict[str, str | None]:
    return {lib: package_version(lib) for lib in libraries()}


def machine() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
    }


def accelerators() -> list[dict[str, Any]]:
    try:
        from evalkit.hardware import detect_accelerators
    except ImportError:
        return []
    from dataclasses import asdict

    return [asdict(a) for a in detect_accelerators()]
