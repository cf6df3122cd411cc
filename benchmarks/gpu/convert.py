"""llama.cpp's convert_hf_to_gguf.py, with one allowance for random-weight checkpoints made by make_model.py:
a checkpoint that borrows another model's tokenizer (the Qwen2.5-7B shape with SmolLM2's tokenizer) has a
BPE pre-tokenizer the converter's hash table does not list for that architecture; it is then declared
`--pre` (default "smollm", the tokenizer's own). Every other step is the converter's.

    python convert.py LLAMA_CPP_DIR [--pre NAME] -- CONVERTER_ARGS...
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

llama_dir = Path(sys.argv[1])
args = sys.argv[2:]
pre = "smollm"
if args[:1] == ["--pre"]:
    pre, args = args[1], args[2:]
if args[:1] == ["--"]:
    args = args[1:]
sys.path.insert(0, str(llama_dir))
sys.path.insert(1, str(llama_dir / "gguf-py"))
from conversion import base  # noqa: E402  (llama.cpp's converter package)

known = base.TextModel.get_vocab_base_pre


def _pre(self, tokenizer):  # type: ignore[no-untyped-def]
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        print(f"convert.py: pre-tokenizer hash not listed; declaring {pre!r} (borrowed tokenizer)", file=sys.stderr)
        return pre


base.TextModel.get_vocab_base_pre = _pre
sys.argv = [str(llama_dir / "convert_hf_to_gguf.py"), *args]
runpy.run_path(sys.argv[0], run_name="__main__")
