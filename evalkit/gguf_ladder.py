"""llama.cpp's side of the model variants: the GGUF ladder (`Q8_0` ... `Q2_K`) made by llama.cpp's quantizer
(`llama_model_quantize`), llama.cpp's own tokenization of a GGUF (the hf variant's token-parity check), each run in
a child process (`python -m evalkit.gguf_ladder`) so a crash there cannot take the caller down, and the GGUF
metadata variants read (tokenizer flags, chat template, file and tensor types).
"""
from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from evalkit.affinity import available_cores
from evalkit.errors import VariantError
from evalkit.models import read_gguf_header
from evalkit.versions import package_version

_16BIT_GGUF_TYPES = {"F32", "F16", "BF16"}


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The GGUF facts variants need: tokenizer flags, chat template, file type, tensor types."""
    try:
        import gguf
    except ImportError:
        raise VariantError(str(path), "the gguf package is not installed (pip install 'evalkit[prepare]')") from None
    try:
        head = read_gguf_header(path)
    except (OSError, ValueError, struct.error) as e:
        raise VariantError(str(path), f"cannot read GGUF metadata: {_first_line(e)}") from None
    kv, tensor_types = head.meta, [t for _, _, t, _ in head.tensors]
    file_type = kv.get("general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        file_type_name = str(file_type)
    types: dict[str, int] = {}
    for t in tensor_types:
        try:
            name = gguf.GGMLQuantizationType(t).name
        except ValueError:
            name = str(t)
        types[name] = types.get(name, 0) + 1
    return {
        "architecture": kv.get("general.architecture"),
        "add_bos": bool(kv.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos": bool(kv.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token_id": kv.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": kv.get("tokenizer.ggml.eos_token_id"),
        "chat_template": kv.get("tokenizer.chat_template"),
        "file_type": file_type_name,
        "tensor_types": types,
        "is_16bit": set(types) <= _16BIT_GGUF_TYPES,
    }


def build_gguf(source: str, gguf: Path, qtype: str, out: Path) -> dict[str, Any]:
    meta = gguf_metadata(gguf)
    dst = out / f"model-{qtype}.gguf"
    requantize = not meta["is_16bit"]
    result = run_llama_helper(source, ["quantize", str(gguf), str(dst), qtype, "1" if requantize else "0"])
    out_meta = gguf_metadata(dst)
    src_type = meta.get("file_type") or "quantized"
    return {
        "model_file": dst.name,
        "quantizer": "llama.cpp llama_model_quantize (in a subprocess)",
        "llama_cpp_python": package_version("llama-cpp-python"),
        "source_file_type": meta.get("file_type"),
        "requantized": requantize,
        "path_taken": (
            f"requantized from {src_type}: llama.cpp dequantizes each tensor to F32 and quantizes it to "
            f"{qtype}. Chosen over converting the hf variant back to an F16 GGUF because it is the same "
            "arithmetic without an extra bf16 rounding and keeps the GGUF's own tokenizer metadata. Rungs "
            f"finer than {src_type} cannot recover what {src_type} lost: they measure the {src_type} model "
            "re-encoded, not the original model at that precision."
            if requantize
            else f"quantized from the {src_type} source"
        ),
        "file_type": out_meta.get("file_type"),
        "tensor_types": out_meta["tensor_types"],
        "verified": result,
    }


def run_llama_helper(source: str, args: list[str], *, stdin: str | None = None) -> Any:
    """Run a llama.cpp job in a child process: a crash there cannot take the caller (or its vLLM) down."""
    proc = subprocess.run(
        [sys.executable, "-m", "evalkit.gguf_ladder", *args],
        input=stdin,
        capture_output=True,
        text=True,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if proc.returncode == 3:
            raise VariantError(source, "llama-cpp-python is not installed (pip install 'evalkit[llamacpp]')")
        raise VariantError(source, f"llama.cpp {args[0]} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def die_with_parent() -> None:
    # A killed prepare must not leave its quantizer running (and writing) as an orphan.
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def llama_tokenize(gguf: Path, texts: list[str], *, add_bos: bool) -> list[list[int]]:
    """llama.cpp's token ids for `texts` (special tokens parsed, as HF tokenizers do), from a child process."""
    return run_llama_helper(
        str(gguf), ["tokenize", str(gguf), "1" if add_bos else "0"], stdin=json.dumps(texts)
    )


def llama_child(argv: list[str]) -> int:
    """The child side of `run_llama_helper`. Prints one JSON line on success."""
    import ctypes

    from evalkit.engines.llamacpp_lib import load_llama_cpp

    try:
        llama_cpp = load_llama_cpp()
    except ImportError:
        return 3
    if argv[0] == "quantize":
        src, dst, qtype, requant = argv[1], argv[2], argv[3], argv[4] == "1"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
        params.allow_requantize = requant
        params.nthread = available_cores()
        if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
            print(f"llama_model_quantize returned an error for {qtype}", file=sys.stderr)
            return 1
        # Verify: the file loads and decodes a few tokens greedily.
        llm = llama_cpp.Llama(dst, n_ctx=64, n_threads=params.nthread, verbose=False)
        out = llm("The capital of France is", max_tokens=4, temperature=0.0)
        print(json.dumps({"loads": True, "n_vocab": llm.n_vocab(), "sample": out["choices"][0]["text"]}))
        llm.close()
        return 0
    if argv[0] == "tokenize":
        llm = llama_cpp.Llama(argv[1], vocab_only=True, verbose=False)
        texts = json.loads(sys.stdin.read())
        ids = [llm.tokenize(t.encode("utf-8"), add_bos=argv[2] == "1", special=True) for t in texts]
        print(json.dumps(ids))
        llm.close()
        return 0
    print(f"unknown llama job {argv[0]!r}", file=sys.stderr)
    return 2


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


if __name__ == "__main__":
    sys.exit(llama_child(sys.argv[1:]))
