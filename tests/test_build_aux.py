"""build-aux/llama-cc, the compiler launcher of the llama.cpp build: which sources it moves from -O3 to -O1.

That the tools built this way compute the same bytes was checked against an all -O3 build when it was written
(build-aux/llama-cc's header); every peer and served test in `make test` runs the tools built through it."""
from __future__ import annotations

import subprocess

import pytest

from conftest import REPO

LAUNCHER = REPO / "build-aux" / "llama-cc"
TREE = "/x/.cache/peer/llama-cpp-python-0.3.36/src/vendor/llama.cpp"


def compiled_with(source: str) -> list[str]:
    """The command line the launcher runs for `source` (`echo` standing in for the compiler)."""
    proc = subprocess.run([str(LAUNCHER), "echo", "-O3", "-DNDEBUG", "-I", f"{TREE}/common/.", "-o", "x.o", "-c", source],
                          capture_output=True, text=True, check=True)
    return proc.stdout.split()


@pytest.mark.parametrize("source", ["common/arg.cpp", "common/sampling.cpp", "tools/server/server-context.cpp",
                                    "tools/mtmd/clip.cpp", "vendor/cpp-httplib/httplib.cpp"])
def test_code_that_computes_nothing_measured_compiles_at_o1(source: str) -> None:
    args = compiled_with(f"{TREE}/{source}")
    assert "-O1" in args and "-O3" not in args and args[-1] == f"{TREE}/{source}"


@pytest.mark.parametrize("source", ["ggml/src/ggml-cpu/ops.cpp", "ggml/src/ggml-quants.c", "src/llama-model.cpp",
                                    "tools/perplexity/perplexity.cpp", "tools/quantize/quantize.cpp"])
def test_kernels_libllama_and_the_tools_own_code_keep_o3(source: str) -> None:
    args = compiled_with(f"{TREE}/{source}")
    assert "-O3" in args and "-O1" not in args  # an include path under common/ does not count
