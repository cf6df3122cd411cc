"""llama.cpp's own command-line tools (`llama-perplexity`, `llama-quantize`): the peer that evalkit's
perplexity and KLD are checked against, in tests and benchmarks.

One environment variable names their directory everywhere: `LLAMA_CPP_BIN` (the Makefile exports it; its
default is where `make peer` builds them: .cache/peer/llama-cpp-python-<version>/build/bin, from the
llama.cpp sources inside the llama-cpp-python sdist the venv pins).
"""
from __future__ import annotations

import os
from pathlib import Path

from evalkit.versions import package_version

ENV = "LLAMA_CPP_BIN"
REPO = Path(__file__).resolve().parents[1]


def default_bin_dir() -> Path:
    version = package_version("llama_cpp_python") or "unknown"
    return REPO / ".cache" / "peer" / f"llama-cpp-python-{version}" / "build" / "bin"


def bin_dir() -> Path:
    return Path(os.environ[ENV]) if os.environ.get(ENV) else default_bin_dir()


def tool(name: str) -> Path | None:
    """Path of a built llama.cpp tool (`llama-perplexity`, `llama-quantize`), or None when absent."""
    path = bin_dir() / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_hint(name: str) -> str:
    return f"{name} not found in {bin_dir()} (run `make peer`, or set {ENV} to the directory holding it)"
