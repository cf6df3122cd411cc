"""Loading llama-cpp-python so that libllama's C++ runtime calls reach libstdc++ (a leaf: the engine, its tokenizer
stand-in and the variants' quantize/tokenize child all import llama_cpp through it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType


def load_llama_cpp() -> ModuleType:
    """`llama_cpp`, with libstdc++ first put into the process's global symbol scope (Linux).

    On the H200 (CUDA build) a GGUF load segfaulted right after "init_tokenizer" in any process that had imported
    numpy before llama_cpp (evalkit's workers do): numpy's extension modules load libstdc++ privately (RTLD_LOCAL),
    so the C++ runtime calls of libllama's std::regex code (the BPE pre-tokenizer compiles one) bound to copies
    inside libggml-cuda instead (cuda-gdb: std::codecvt<char16_t>::do_unshift in libggml-cuda.so.0 called from
    _BracketMatcher::_M_ready). Measured there, numpy imported first: with libstdc++ loaded RTLD_GLOBAL before
    llama_cpp the load works; without it, and with libllama loaded RTLD_DEEPBIND, it crashes."""
    if "llama_cpp" not in sys.modules and sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError:  # no shared libstdc++ (a static build): nothing to bind against
            pass
    import llama_cpp

    from evalkit.interrupts import keep_interrupts

    keep_interrupts()  # llama.cpp logs through Python callbacks, where Ctrl-C was lost (here for notebooks too)
    return llama_cpp


def lib_dir() -> Path | None:
    """Where llama_cpp loads libllama from (llama_cpp/llama_cpp.py): LLAMA_CPP_LIB_PATH, else the package's lib/."""
    from importlib.util import find_spec

    spec = find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(spec.origin).parent / "lib")
