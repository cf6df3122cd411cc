"""The quantizer's side of evalkit.quantize: runs under `.venv-quant`'s interpreter, reads one JSON job on stdin,
writes the compressed-tensors checkpoint and prints one JSON line (timings, versions, a greedy sample).

Imports llm-compressor by name at run time (it is not in the main venv, where mypy and the tests run)."""
from __future__ import annotations

import importlib
import json
import sys
import time
from importlib.metadata import version
from typing import Any


def _windows(tok: Any, text: str, samples: int, seq_len: int) -> list[list[int]]:
    """`samples` consecutive windows of `seq_len` tokens from the start of the text (fewer if it is short)."""
    ids: list[int] = tok(text[: samples * seq_len * 12]).input_ids  # ~12 characters a token is plenty
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(min(samples, len(ids) // seq_len))]


def main() -> int:
    job = json.loads(sys.stdin.read())
    import torch

    torch.set_num_threads(int(job.get("threads") or 1))
    transformers = importlib.import_module("transformers")
    datasets = importlib.import_module("datasets")
    llmc = importlib.import_module("llmcompressor")
    quant = importlib.import_module("llmcompressor.modifiers.quantization")
    awq = importlib.import_module("llmcompressor.modifiers.awq")
    transform = importlib.import_module("llmcompressor.modifiers.transform")
    if not torch.cuda.is_available():
        # AWQ pins its cached activations for faster host-to-GPU copies; pinning needs an accelerator and fails
        # on a CPU-only machine ("Cannot access accelerator device"). Without a GPU there is nothing to copy to.
        cache = importlib.import_module("llmcompressor.pipelines.cache")
        cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None

    tok = transformers.AutoTokenizer.from_pretrained(job["model"])
    model = transformers.AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.bfloat16)
    with open(job["calibration"], encoding="utf-8") as f:
        windows = _windows(tok, f.read(), int(job["samples"]), int(job["seq_len"]))
    if not windows:
        print(f"calibration text {job['calibration']} is shorter than one window of {job['seq_len']} tokens", file=sys.stderr)
        return 2
    ds = datasets.Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * len(w) for w in windows]})
    r = job["recipe"]
    mods: list[Any] = []
    if "smoothquant" in r:
        mods.append(transform.SmoothQuantModifier(smoothing_strength=r["smoothquant"]))
    if r["modifier"] == "AWQModifier":
        mods.append(awq.AWQModifier(config_groups=r["config_groups"], ignore=["lm_head"]))
    elif "scheme" in r:
        mods.append(quant.GPTQModifier(targets="Linear", scheme=r["scheme"], ignore=["lm_head"]))
    else:
        mods.append(quant.GPTQModifier(config_groups=r["config_groups"], ignore=["lm_head"]))
    started = time.monotonic()
    # In text order, not llm-compressor's default shuffle: that draws from torch's unseeded generator, so two builds
    # of one variant summed GPTQ's Hessian in other orders and differed in their bytes (and the seed, for any
    # other draw).
    torch.manual_seed(0)
    llmc.oneshot(model=model, dataset=ds, recipe=mods, max_seq_length=int(job["seq_len"]),
                 num_calibration_samples=len(windows), shuffle_calibration_samples=False)
    seconds = time.monotonic() - started
    model.save_pretrained(job["out"], save_compressed=True)
    tok.save_pretrained(job["out"])
    recipe_yaml = None
    try:
        with open(f"{job['out']}/recipe.yaml", encoding="utf-8") as f:
            recipe_yaml = f.read()
    except OSError:
        pass
    print(json.dumps({
        "quantize_seconds": seconds, "samples": len(windows), "tokens": sum(map(len, windows)), "recipe_yaml": recipe_yaml,
        "versions": {p: version(p) for p in ("llmcompressor", "compressed-tensors", "torch", "transformers")},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
