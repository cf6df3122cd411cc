"""Run pytest on the numeric paths an AVX2-only machine takes, from any machine (issue 30).

    python tests/avx2_paths.py -q -m "host_sensitive and not engine and not vllm and not gpu"   # what `make test` runs
    python tests/avx2_paths.py -q tests/test_rescore_recorded_run.py               # any pytest arguments

This project's machines come in two CPU kinds (AVX-512 with avx512_bf16, or AVX2 only) and CI runs on
either. numpy and torch pick their kernels by CPU at import: on AVX-512 numpy's float64 exp/log are its own
vector code, on AVX2 they are libm's, and the two differ in the last bit. So a test that is green on one kind
can be red on the other. This script turns the AVX-512 paths off where a switch exists and runs pytest again
under them, so an AVX-512 machine fails where an AVX2 one would:

- numpy: NPY_DISABLE_CPU_FEATURES = every dispatched AVX-512 feature of the numpy installed (the names differ
  between numpy versions, so they are read from numpy, not written here);
- torch: ATEN_CPU_CAPABILITY=avx2; oneDNN and MKL: ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2;
  numpy's OpenBLAS: OPENBLAS_CORETYPE=Haswell (evalkit's hardware.cpu_native_bf16 honours the first two, so
  bf16 deployments compute in float32 as on an AVX2 machine);
- torch.cpu's ISA probes, which read CPUID and ignore the variables above: benchmarks/avx2_emu's
  sitecustomize with EVALKIT_EMULATE_AVX2=1 makes them answer as an AVX2 CPU would (vLLM reads them).

Not switched: llama.cpp (libllama is compiled for this CPU; evalkit and the peer tools share that build, so
their agreement is checked on the same kernels either way). So `make test` leaves the `engine` tests out of this
pass: under the switches their llama.cpp computes the very same logits, and what changes (numpy's exp/log, last
bit, ~1e-16 relative) lies orders below their tolerances (1e-6 relative and looser, against a peer or a direct
computation made on the same host); the tests whose figures can turn on the last bit (recorded-run re-scoring,
KLD and perplexity arithmetic, cache keys) are not `engine` tests and all run. Their rerun took ~4 of this
pass's ~5 minutes. (An AVX2 llama.cpp can be had too: ggml-cpu alone built with -DGGML_NATIVE=OFF
-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON, ~40 s on 2 cores, its libggml-cpu.so.0 first on
LD_LIBRARY_PATH: the build's RUNPATH is $ORIGIN, which LD_LIBRARY_PATH precedes, for libllama and the tools
alike.) The child checks that numpy and torch really took the AVX2 paths before any test runs. On a machine without AVX-512 the first pass already ran these paths:
nothing is run again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWITCHES = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "OPENBLAS_CORETYPE": "Haswell", "EVALKIT_EMULATE_AVX2": "1"}

# Run in the child, under the switches: what numpy and torch say they use.
_PROBE = """
import json, numpy._core._multiarray_umath as m
wide = [f for f in m.__cpu_dispatch__ if f.startswith("AVX512") or f == "X86_V4"]
out = {"numpy_avx512_on": [f for f in wide if m.__cpu_features__.get(f)]}
try:
    import torch
    out["torch"] = torch.backends.cpu.get_cpu_capability()
except ImportError:
    out["torch"] = None
print(json.dumps(out))
"""


def avx512_features() -> tuple[list[str], list[str]]:
    """(numpy's dispatched AVX-512 feature names, those this CPU has)."""
    import numpy._core._multiarray_umath as m

    wide = [f for f in m.__cpu_dispatch__ if f.startswith("AVX512") or f == "X86_V4"]
    return wide, [f for f in wide if m.__cpu_features__.get(f)]


def avx2_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    wide, _ = avx512_features()
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(wide)
    env.update(SWITCHES)
    emu = str(REPO / "benchmarks" / "avx2_emu")
    env["PYTHONPATH"] = os.pathsep.join([emu] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def main(argv: list[str]) -> int:
    wide, present = avx512_features()
    if not present:
        print("avx2_paths: this CPU has no AVX-512 numpy path: the first pass already ran the AVX2 paths", flush=True)
        return 0
    env = avx2_env()
    probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    seen = json.loads(probe.stdout)
    if seen["numpy_avx512_on"] or seen["torch"] not in (None, "AVX2"):
        print(f"avx2_paths: the switches did not take: {seen}", file=sys.stderr)
        return 2
    print(f"avx2_paths: numpy without {' '.join(present)}; torch {seen['torch']}; "
          + " ".join(f"{k}={v}" for k, v in SWITCHES.items()), flush=True)
    return subprocess.run([sys.executable, "-m", "pytest", *argv], env=env, cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
