"""A random-weight checkpoint of a real architecture, from its config.json alone (benchmarks/gpu, on the device).

Random weights hold memory, throughput, time to first token and FP8-vs-bf16 numerics on the same weights
to real scale; quality figures on them (prompts, MMLU, perplexity) mean nothing. Seeded, so a re-run makes
the same weights. The tokenizer files are copied from `--tokenizer` (a real tokenizer; a vocabulary
smaller than the config's is padded by the GGUF converter, as the config's embedding rows are).

    python make_model.py CONFIG_JSON TOKENIZER_DIR OUT_DIR [--device cuda] [--seed 0]
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
import transformers

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "chat_template.jinja", "generation_config.json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config", help="a directory holding config.json")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    if (out / "model.safetensors").exists() or (out / "model.safetensors.index.json").exists():
        print(f"make_model: {out} exists")
        return
    t = time.perf_counter()
    cfg = transformers.AutoConfig.from_pretrained(a.config)
    torch.manual_seed(a.seed)
    with torch.device(a.device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        src = Path(a.tokenizer) / name
        if src.is_file() and not (tmp / name).exists():
            shutil.copy2(src, tmp / name)
    tmp.rename(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_model: {out}: {type(model).__name__}, {n:,} parameters, bf16, seed {a.seed}, {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
