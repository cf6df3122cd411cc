"""Which import, made before llama_cpp, makes loading a GGUF crash? (the CUDA build's import-order segfault)

    python benchmarks/gpu/import_order.py MODEL.gguf [--ngl -1]

Each candidate runs in a fresh process: import the candidate modules, then llama_cpp, then load the GGUF on
the GPU and decode a few tokens. Prints one line per candidate with the exit code (-11 = SIGSEGV) and, for a
crash, the last lines faulthandler printed. A candidate list that crashes, against the same list minus one
module that does not, names the module.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

CANDIDATES: list[list[str]] = [
    [],
    ["evalkit"],
    ["evalkit.engines.llamacpp"],
    ["evalkit.engines.llamacpp", "evalkit.pipeline"],
    ["pydantic_core"],
    ["pydantic"],
    ["numpy"],
    ["_hashlib", "_decimal", "_lzma", "_bz2", "_uuid"],
    ["torch"],
    ["transformers"],
]

PROBE = """
import sys
for name in {mods!r}:
    __import__(name)
import llama_cpp
llm = llama_cpp.Llama(model_path={model!r}, n_gpu_layers={ngl}, n_ctx=512, verbose=False)
out = llm.create_completion("The capital of France is", max_tokens=8, temperature=0.0)
heavy = sorted(m for m in ("torch", "transformers", "pydantic_core") if m in sys.modules)
print("ok", repr(out["choices"][0]["text"][:30]), "loaded:", heavy)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ngl", type=int, default=-1)
    args = ap.parse_args()
    for mods in CANDIDATES:
        code = PROBE.format(mods=mods, model=args.model, ngl=args.ngl)
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=300)
        tail = (proc.stdout.strip().splitlines() or [""])[-1]
        if proc.returncode != 0:
            tail = " | ".join(line.strip() for line in proc.stderr.strip().splitlines()[-4:])
        print(f"before llama_cpp: {' '.join(mods) or '(nothing)':<50} rc {proc.returncode:>4}  {tail[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
