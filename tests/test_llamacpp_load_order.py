"""llama.cpp loads and generates whatever the process loaded before it (issue 21's H200 crash), and its worker
path pulls in no torch or transformers.

On the H200 a process that imported evalkit's other dependencies before llama_cpp crashed loading a GGUF right
after llama.cpp's "init_tokenizer" log line: libllama's calls into its own std::regex template code (the BPE
pre-tokenizer compiles a regex there) were bound to another library's copy, loaded earlier with RTLD_GLOBAL.
Here such a library is made for real: a shared object defining libllama's exported std::regex _Compiler
constructors (weak, as template instantiations are) that abort. Loaded first, it kills a plain `import llama_cpp`
load at that very point (the control: the test can fail); evalkit's engine (`load_llama_cpp`, RTLD_DEEPBIND)
loads, generates and gives the tokens a clean process gives.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_module, require_tool

pytestmark = pytest.mark.engine

# std::__detail::_Compiler<std::__cxx11::regex_traits<char>>::_Compiler(char const*, char const*, std::locale
# const&, syntax_option_type), complete and base object constructors: what std::regex's constructor calls.
COMPILER_CTORS = [f"_ZNSt8__detail9_CompilerINSt7__cxx1112regex_traitsIcEEE{c}EPKcS6_RKSt6localeNSt15regex_constants18syntax_option_typeE"
                  for c in ("C1", "C2")]

CHILD = r"""
import ctypes, json, os, sys
interposer, mode, gguf = sys.argv[1:4]
if interposer:
    ctypes.CDLL(interposer, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
if mode == "plain":
    import llama_cpp
    llama_cpp.Llama(model_path=gguf, n_ctx=256, verbose=False)
    print(json.dumps({"loaded": True}))
else:
    from evalkit.engines.base import GenRequest, SamplingParams
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
    engine = LlamaCppEngine(gguf, LlamaCppOptions(n_ctx=512, n_threads=1))
    (res,) = engine.generate([GenRequest("q", "What is the capital of France?")], SamplingParams(max_tokens=12))
    print(json.dumps({"tokens": res.output_token_ids, "heavy": sorted({"torch", "transformers"} & set(sys.modules))}))
"""


def _child(tmp: Path, interposer: str, mode: str, gguf: Path) -> subprocess.CompletedProcess[str]:
    script = tmp / "child.py"
    script.write_text(CHILD)
    return subprocess.run([sys.executable, str(script), interposer, mode, str(gguf)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_llama_cpp_loads_whatever_came_first(tmp_path: Path, smollm_gguf: Path) -> None:
    import ctypes

    from evalkit.engines.llamacpp_lib import lib_dir

    require_module("llama_cpp", "llama.cpp engine")
    cc = require_tool("cc", "gcc", why="builds the interposing library")
    lib_path = lib_dir()
    assert lib_path is not None
    libllama = lib_path / "libllama.so"
    exported = ctypes.CDLL(str(libllama))
    assert all(hasattr(exported, s) for s in COMPILER_CTORS)  # libllama exports them: they can be interposed
    src = tmp_path / "interpose.c"
    src.write_text("#include <stdlib.h>\n" + "".join(f"__attribute__((weak)) void {s}(void) {{ abort(); }}\n" for s in COMPILER_CTORS))
    lib = tmp_path / "libinterpose.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)

    clean = _child(tmp_path, "", "engine", smollm_gguf)
    assert clean.returncode == 0, clean.stderr[-2000:]
    want = json.loads(clean.stdout.strip().splitlines()[-1])
    assert want["heavy"] == []  # a llama.cpp engine that loaded a GGUF and generated imported no torch/transformers
    assert len(want["tokens"]) > 3

    plain = _child(tmp_path, str(lib), "plain", smollm_gguf)
    assert plain.returncode == -signal.SIGABRT, (plain.returncode, plain.stdout, plain.stderr[-2000:])  # the crash

    fixed = _child(tmp_path, str(lib), "engine", smollm_gguf)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert json.loads(fixed.stdout.strip().splitlines()[-1])["tokens"] == want["tokens"]
