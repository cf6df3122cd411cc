"""llama.cpp loads and generates whatever the process imported before it (issue 21's H200 crash), and its worker
path pulls in no torch or transformers.

On the H200 (CUDA build) a process that imported numpy before llama_cpp crashed loading a GGUF right after
llama.cpp's "init_tokenizer" line: numpy had loaded libstdc++ privately, so libllama's std::regex code bound its
C++ runtime calls to copies inside libggml-cuda (evalkit.engines.llamacpp_lib says how it was found). The engine
loads libstdc++ into the global scope first. The crash needs the CUDA library, so here the test checks the parts
a CPU shows: the real libraries imported in the order that crashed (numpy, torch, then the engine) load and give
the tokens of a clean process, and a llama.cpp engine imports no torch/transformers. tests/test_gpu.py and run_on_device.sh's load-order check run it on a GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_module, require_tool

pytestmark = pytest.mark.engine

CHILD = r"""
import json, sys
first, gguf = sys.argv[1], sys.argv[2]
for name in filter(None, first.split(",")):
    __import__(name)
from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
engine = LlamaCppEngine(gguf, LlamaCppOptions(n_ctx=512, n_threads=1))
(res,) = engine.generate([GenRequest("q", "What is the capital of France?")], SamplingParams(max_tokens=12))
print(json.dumps({"tokens": res.output_token_ids, "heavy": sorted({"torch", "transformers"} & set(sys.modules))}))
"""


def _child(tmp: Path, first: str, gguf: Path) -> dict:
    script = tmp / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), first, str(gguf)], capture_output=True, text=True,
                          timeout=180, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, (first, proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_llama_cpp_loads_whatever_came_first(tmp_path: Path, smollm_gguf: Path) -> None:
    require_module("llama_cpp", "llama.cpp engine")
    clean = _child(tmp_path, "", smollm_gguf)
    assert clean["heavy"] == []  # a llama.cpp engine that loaded a GGUF and generated imported no torch/transformers
    assert len(clean["tokens"]) > 3
    late = _child(tmp_path, "numpy,torch", smollm_gguf)  # the order that crashed on the H200
    assert late["tokens"] == clean["tokens"]
