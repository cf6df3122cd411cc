"""Loading llama-cpp-python so that libllama binds to its own C++ code (a leaf: the engine, its tokenizer stand-in
and the variants' quantize/tokenize child all import llama_cpp through it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType


def load_llama_cpp() -> ModuleType:
    """`llama_cpp`, its libllama (with libggml and the backends it needs) loaded first with RTLD_DEEPBIND on Linux.

    libllama exports the C++ template code it instantiates (std::regex's among them) as weak symbols, and the
    dynamic linker binds its calls to the first copy in the process's global scope: a library loaded earlier
    with RTLD_GLOBAL (torch's CUDA dependencies, say), built by another compiler, then runs in its place. On the
    H200 a GGUF load crashed so, right after "init_tokenizer" (the BPE pre-tokenizer compiles a std::regex), in
    any process that had imported evalkit's other dependencies first. DEEPBIND makes libllama look in itself
    first (tests/test_llamacpp_load_order.py reproduces the crash and shows this prevents it)."""
    lib = None if "llama_cpp" in sys.modules else lib_dir()
    if lib is not None and (lib / "libllama.so").exists() and hasattr(os, "RTLD_DEEPBIND"):
        import ctypes

        ctypes.CDLL(str(lib / "libllama.so"), mode=os.RTLD_NOW | os.RTLD_DEEPBIND)  # llama_cpp's CDLL gets this handle
    import llama_cpp

    return llama_cpp


def lib_dir() -> Path | None:
    """Where llama_cpp loads libllama from (llama_cpp/llama_cpp.py): LLAMA_CPP_LIB_PATH, else the package's lib/."""
    from importlib.util import find_spec

    spec = find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(spec.origin).parent / "lib")
