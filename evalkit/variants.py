"""Model variants made from one source file: an HF checkpoint, FP8 weight emulation, and a GGUF ladder.

`prepare_variant(source, variant)` returns a local model path. Results live under
`cache_dir()/variants/<source sha256[:16]>/<variant>/` (keyed by content, not name). Each is built in a
`.tmp-*` sibling directory and renamed into place only once complete, with `evalkit_variant.json`
(provenance) written last inside it: a directory without that file is never treated as finished.

Variants:
- `hf`: the GGUF dequantized into a Hugging Face checkpoint (safetensors, bf16) that vLLM loads, with the
  tokenizer made to add BOS/EOS exactly as the GGUF says llama.cpp does, and the GGUF's chat template.
- `fp8-weight`: the `hf` checkpoint with every decoder linear weight rounded through FP8 E4M3 with a
  per-output-channel scale, stored back in 16 bits (an emulation of vLLM's weight-only FP8, see
  `fp8_roundtrip`).
- `Q8_0` ... `Q2_K`: llama.cpp's quantizer (`llama_model_quantize`) run in a subprocess.
- `gptq-w4g64`, `gptq-w8g64`, `awq-w4g64`, `w8a8-int8` (any name evalkit.quant_formats accepts): the `hf`
  checkpoint quantized by llm-compressor (evalkit.quantize, in its own interpreter) into compressed-tensors,
  calibrated on a named text. Their cache directory is `<format>-cal-<text sha256[:12]>-<samples>x<seq_len>`:
  another calibration text or size is another variant.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Sequence

from filelock import FileLock

from evalkit.config import VARIANTS
from evalkit.engines import ENGINES, engine_spec
from evalkit.engines.fp8_rounding import fp8_roundtrip
from evalkit.errors import EvalkitError, VariantError
from evalkit.fileio import pid_alive
from evalkit.gguf_ladder import build_gguf, gguf_metadata, llama_tokenize
from evalkit.models import (GGUF_KIND, HF_KIND, HF_VARIANT, HF_VARIANTS, NATIVE_FP8_VARIANT, cache_dir, check_model,
                            fingerprint, resolve_source)
from evalkit.quant_formats import looks_like_format
from evalkit.quantize import Calibration, calibration_from, check_request
from evalkit.quantize import build as build_quantized
from evalkit.versions import package_version

if TYPE_CHECKING:
    from evalkit.config import Config

LADDER = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
PROVENANCE = "evalkit_variant.json"
# Strings whose tokenization must match llama.cpp's (spaces, newlines, unicode, code, digits, a special token).
PARITY_STRINGS = (
    "hello",
    " hello world",
    "Hello, World!\n\nNew  line\ttab",
    "naïve café 東京 🙂",
    "  leading spaces",
    "def f(x):\n    return x**2\n",
    "1234567890 3.14159",
)


# ---------------------------------------------------------------------------------------------- public API


def prepare_variant(source: str, variant: str | None, *, force: bool = False, progress: bool = True,
                    calibration: Calibration | None = None) -> Path:
    """A local model path for `source` turned into `variant` (None: the source itself). Cached by content.
    `calibration`: the text a GPTQ/AWQ/W8A8 variant is calibrated on (default: evalkit.quantize's)."""
    path = resolve_source(source)
    kind = check_model(path, source)
    if variant is None:
        return path
    if variant not in VARIANTS and not looks_like_format(variant):
        raise VariantError(source, f"unknown variant {variant!r} (expected one of {', '.join(VARIANTS)}, or a "
                                   "quantization format: gptq-w4g64, gptq-w8g64, awq-w4g64, w8a8-int8)")
    calib = (calibration or calibration_from(None)) if looks_like_format(variant) else None
    if calib is not None:  # every check that needs no quantizer, before anything is written
        check_request(source, variant, calib, path)
    if variant == HF_VARIANT and kind == HF_KIND:
        return path  # already a Hugging Face checkpoint
    if variant in LADDER and kind != GGUF_KIND:
        raise VariantError(
            source, f"variant {variant} is made by llama.cpp's quantizer and needs a GGUF source, not a Hugging Face checkpoint"
        )
    sha = fingerprint(path).sha256
    base = cache_dir() / "variants" / sha[:16]
    final = base / _dir_name(variant, calib)
    if not force and _is_done(final):
        return _model_path(final)
    base.mkdir(parents=True, exist_ok=True)
    # One builder per variant across processes sharing the cache: the others wait, then find it done
    # (without the lock each would spend minutes building the same thing, and --force could move a
    # variant aside while another process loads it).
    with FileLock(base / f".{variant}.lock"):
        if not force and _is_done(final):
            _say(progress, f"evalkit: variant {variant} of {source} was prepared by another process: {_model_path(final)}")
            return _model_path(final)
        _sweep_stale(base)
        tmp = base / f".tmp-{variant}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        started = time.monotonic()
        _say(progress, f"evalkit: preparing variant {variant} of {source} ...")
        try:
            extra = _build(variant, source, path, kind, tmp, progress=progress, calibration=calib)
            record = _provenance(source, path, sha, kind, variant, extra, time.monotonic() - started)
            _write_json(tmp / PROVENANCE, record)  # last: its presence marks a finished variant
            _publish(tmp, final, force=force)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already if published
    _say(progress, f"evalkit: variant {variant} ready in {time.monotonic() - started:.1f}s: {_model_path(final)}")
    return _model_path(final)


def built_variant(source: str, variant: str, calibration: Calibration | None = None) -> Path | None:
    """The model path of `variant` of `source` when it is already prepared in the cache, else None.
    Never builds (the memory plan reads exact sizes from it when it exists)."""
    path = resolve_source(source)
    if variant == HF_VARIANT and path.is_dir():
        return path
    calib = (calibration or calibration_from(None)) if looks_like_format(variant) else None
    final = cache_dir() / "variants" / fingerprint(path).sha256[:16] / _dir_name(variant, calib)
    return _model_path(final) if _is_done(final) else None


def _dir_name(variant: str, calibration: Calibration | None) -> str:
    return variant if calibration is None else f"{variant}-{calibration.key()}"


def prepare_all(config: "Config", *, force: bool = False, progress: bool = True) -> list[tuple[str, Path]]:
    """Prepare every deployment's model (variant or plain source). Returns (deployment name, local path)."""
    out: list[tuple[str, Path]] = []
    for dep in config.deployments:
        if dep.model is None:  # a served model whose weights are not named: nothing local to prepare
            continue
        variant = dep.model.variant
        spec = engine_spec(dep.engine)
        if (variant in HF_VARIANTS or looks_like_format(variant)) and not spec.loads_kind(HF_KIND):
            raise VariantError(
                f"deployment {dep.name}",
                f"engine {dep.engine} cannot load the {variant} variant (a Hugging Face checkpoint); use a GGUF variant "
                f"or an engine that loads one ({', '.join(n for n in ENGINES if engine_spec(n).loads_kind(HF_KIND))})",
            )
        out.append((dep.name, prepare_variant(dep.model.source, variant, force=force, progress=progress)))
    return out


def read_provenance(path: Path) -> dict[str, Any] | None:
    """The provenance record of a prepared variant (its model file or directory), None for a plain source."""
    for d in (path, path.parent):
        f = d / PROVENANCE
        if d.is_dir() and f.is_file():
            return json.loads(f.read_text())
    return None


# ---------------------------------------------------------------------------------------------- cache


def _is_done(final: Path) -> bool:
    try:
        record = json.loads((final / PROVENANCE).read_text())
    except (OSError, ValueError):
        return False
    return (final / record.get("model_file", ".")).exists()


def _model_path(final: Path) -> Path:
    record = json.loads((final / PROVENANCE).read_text())
    name = record.get("model_file", ".")
    return final if name == "." else final / name


def _publish(tmp: Path, final: Path, *, force: bool) -> None:
    """Rename the finished temp dir into place. A stale or forced-over old variant is moved aside first."""
    if final.exists():
        if _is_done(final) and not force:
            return  # another process finished the same variant while we built ours: keep theirs
        trash = final.parent / f".trash-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if not _is_done(final):  # lost a race to a writer that is not finished either: a real problem
            raise


def _sweep_stale(base: Path) -> None:
    """Remove temp/trash dirs left by processes that died (a killed prepare leaves one behind)."""
    for d in base.glob(".*-*-*-*"):
        if not d.name.startswith((".tmp-", ".trash-")):
            continue
        try:
            pid = int(d.name.rsplit("-", 2)[1])
        except ValueError:
            continue
        if not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


def _provenance(
    source: str, path: Path, sha: str, kind: str, variant: str, extra: dict[str, Any], seconds: float
) -> dict[str, Any]:
    return {
        "variant": variant,
        "source": source,
        "source_path": str(path),
        "source_sha256": sha,
        "source_format": kind,
        "evalkit_version": package_version("evalkit"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "prepare_seconds": round(seconds, 2),
        **extra,
    }


def _build(variant: str, source: str, path: Path, kind: str, out: Path, *, progress: bool,
           calibration: Calibration | None = None) -> dict[str, Any]:
    if calibration is not None:  # GPTQ / AWQ / INT8 W8A8 by llm-compressor, from the 16-bit checkpoint
        hf_dir = path if kind == HF_KIND else prepare_variant(source, HF_VARIANT, progress=progress)
        return build_quantized(source, hf_dir, variant, calibration, out, progress=progress)
    if variant == HF_VARIANT:
        return _build_hf(source, path, out, progress)
    if variant == "fp8-weight":
        hf_dir = path if kind == HF_KIND else prepare_variant(source, HF_VARIANT, progress=progress)
        return _build_fp8(hf_dir, out, progress)
    if variant == NATIVE_FP8_VARIANT:
        hf_dir = path if kind == HF_KIND else prepare_variant(source, HF_VARIANT, progress=progress)
        return _build_native_fp8(hf_dir, out)
    return build_gguf(source, path, variant, out)


# ---------------------------------------------------------------------------------------------- hf


def _build_hf(source: str, gguf: Path, out: Path, progress: bool) -> dict[str, Any]:
    torch, transformers = _require_transformers(source)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    with contextlib.ExitStack() as stack:
        if not progress:
            transformers.utils.logging.disable_progress_bar()
            stack.enter_context(_quiet_gguf_tqdm())
        try:
            return _convert_gguf_to_hf(source, gguf, out, torch, transformers)
        finally:
            if bars:
                transformers.utils.logging.enable_progress_bar()


@contextlib.contextmanager
def _quiet_gguf_tqdm() -> Iterator[None]:
    # transformers' GGUF dequantization loop uses a bare tqdm that ignores disable_progress_bar().
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is not None:
        gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def _convert_gguf_to_hf(source: str, gguf: Path, out: Path, torch: Any, transformers: Any) -> dict[str, Any]:
    meta = gguf_metadata(gguf)
    try:
        with _shared_gguf_reader():
            tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, **_dtype_kwarg(transformers, torch.bfloat16), **_dequantize_kwarg(transformers)
            )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise VariantError(source, f"transformers cannot convert this GGUF ({meta.get('architecture')}): {_first_line(e)}") from None
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are dense already.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    del model
    template = _match_tokenizer(tok, meta)
    tok.save_pretrained(out)
    _patch_tokenizer_config(out, meta)
    parity = _check_token_parity(source, gguf, out, meta)
    return {
        "dtype": "bfloat16",
        "model_file": ".",
        "gguf_architecture": meta.get("architecture"),
        "gguf_file_type": meta.get("file_type"),
        "add_bos_token": meta["add_bos"],
        "add_eos_token": meta["add_eos"],
        "chat_template": template,
        "token_parity": parity,
        "transformers_version": package_version("transformers"),
        "note": "weights copied from a 16-bit GGUF"
        if meta["is_16bit"]
        else f"weights dequantized from the GGUF's {meta.get('file_type')} blocks: this is the quantized model "
        "held in 16 bits, not the original unquantized model",
    }


@contextlib.contextmanager
def _shared_gguf_reader() -> Iterator[None]:
    """Let transformers parse the GGUF once instead of three times (tokenizer, config, weights), and build
    gguf's tensor-name map once instead of once per module of the model.

    gguf.GGUFReader turns every vocabulary entry into numpy views: for Gemma's 262k tokens that is
    ~10 s per parse on a quiet core (30+ s on a busy one). Views of a np.memmap run Python code each
    (memmap.__array_finalize__, __getitem__), so the shared reader reads a plain ndarray over the same mapping:
    the same bytes, 1.8 -> 0.7 s for SmolLM2's 49k tokens. transformers' weight mapping walks every module
    of the model and asks `gguf.get_tensor_name_map(arch, n_layers)` afresh at each (397 times for SmolLM2,
    ~7 s of rebuilding the same table). transformers imports both from the gguf module at call time, so
    memoising stand-ins there are seen; the reader is read-only (a memmap) and transformers only looks names
    up in the map, so sharing them is safe. If transformers stops going through them, this saves nothing.
    """
    from unittest import mock

    import gguf
    import gguf.gguf_reader

    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}
    maps: dict[tuple[Any, int], Any] = {}

    def shared(path: Any, mode: Literal["r", "r+", "c"] = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            with mock.patch.object(gguf.gguf_reader, "np", _PlainMemmapNumpy()):
                readers[key] = original_reader(path, mode)
        return readers[key]

    def name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = original_map(arch, n_blocks)
        return maps[arch, n_blocks]

    with mock.patch.object(gguf, "GGUFReader", shared), mock.patch.object(gguf, "get_tensor_name_map", name_map):
        yield


class _PlainMemmapNumpy:
    """numpy, except that `memmap(...)` is a plain ndarray view of the mapping (it keeps the mapping open)."""

    def __getattr__(self, name: str) -> Any:  # once per name: the reader looks names up ~450k times
        import numpy

        value = getattr(numpy, name)
        setattr(self, name, value)
        return value

    @staticmethod
    def memmap(*args: Any, **kwargs: Any) -> Any:
        import numpy

        return numpy.memmap(*args, **kwargs).view(numpy.ndarray)


def _match_tokenizer(tok: Any, meta: dict[str, Any]) -> str | None:
    """Make the HF tokenizer add BOS/EOS as llama.cpp does for this GGUF; carry over the chat template."""
    # The setters rebuild the fast tokenizer's TemplateProcessing post-processor, which is what adds BOS.
    tok.add_bos_token = meta["add_bos"]
    tok.add_eos_token = meta["add_eos"]
    template = meta.get("chat_template")
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    return "from GGUF (tokenizer.chat_template)" if template else None


def _patch_tokenizer_config(out: Path, meta: dict[str, Any]) -> None:
    # transformers does not write these flags; without them a reload (or a later update_post_processor)
    # falls back to the class default, which for Gemma drops the BOS that llama.cpp adds.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["add_bos_token"] = meta["add_bos"]
    cfg["add_eos_token"] = meta["add_eos"]
    _write_json(cfg_path, cfg)


def _check_token_parity(source: str, gguf: Path, hf_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Compare the saved tokenizer with llama.cpp's tokenization of the same GGUF (in a subprocess)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf_ids = [tok(s).input_ids for s in PARITY_STRINGS]
    bos = meta.get("bos_token_id")
    if meta["add_bos"] and bos is not None and any(ids[:1] != [bos] for ids in hf_ids):
        raise VariantError(source, f"saved tokenizer does not prepend BOS ({bos}) although the GGUF asks for it")
    try:
        ref = llama_tokenize(gguf, list(PARITY_STRINGS), add_bos=meta["add_bos"])
    except VariantError as e:
        return {"checked": False, "reason": e.problem}
    mismatches = [s for s, a, b in zip(PARITY_STRINGS, hf_ids, ref) if a != b]
    if mismatches:
        print(f"evalkit: warning: {source}: HF tokenizer differs from llama.cpp on {mismatches[0]!r}", file=sys.stderr)
    return {"checked": True, "strings": len(PARITY_STRINGS), "equal": len(PARITY_STRINGS) - len(mismatches), "mismatches": mismatches}


def _require_transformers(source: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise VariantError(source, f"{e.name} is not installed; the hf and fp8-weight variants need it (pip install 'evalkit[prepare]')") from None
    return torch, transformers


def _dtype_kwarg(transformers: Any, dtype: Any) -> dict[str, Any]:
    # transformers 5 renamed torch_dtype to dtype
    major = int(transformers.__version__.split(".")[0])
    return {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}


def _dequantize_kwarg(transformers: Any) -> dict[str, Any]:
    # transformers >= 5.x keeps GGUF weights packed when a kernel exists; we want plain dense nn.Linear.
    cls: Any = getattr(transformers, "GgufConfig", None)
    if cls is None:
        try:
            from transformers.utils.quantization_config import GgufConfig
        except ImportError:
            return {}
        cls = GgufConfig
    return {"quantization_config": cls(dequantize=True)}


# ---------------------------------------------------------------------------------------------- fp8-weight


def _build_fp8(hf_dir: Path, out: Path, progress: bool) -> dict[str, Any]:
    _require_transformers(str(hf_dir))
    from safetensors import safe_open
    from safetensors.torch import save_file

    targets = linear_weight_names(hf_dir)
    shards = sorted(hf_dir.glob("*.safetensors"))
    if not shards:
        raise VariantError(str(hf_dir), "no .safetensors weights to round (fp8-weight needs a safetensors checkpoint)")
    for f in hf_dir.iterdir():  # config, tokenizer, chat template, index: unchanged
        if f.is_file() and f.suffix != ".safetensors" and f.name != PROVENANCE:
            shutil.copy2(f, out / f.name)
    rounded: list[str] = []
    rel_err: list[float] = []
    dtypes: set[str] = set()
    kept = 0
    for shard in shards:
        with safe_open(shard, framework="pt") as fh:
            meta = fh.metadata()
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        for name, w in tensors.items():
            if name in targets:
                q = fp8_roundtrip(w).to(w.dtype)  # stored back in the checkpoint's own dtype
                dtypes.add(str(w.dtype).removeprefix("torch."))
                rel_err.append(float((q.float() - w.float()).norm() / w.float().norm().clamp_min(1e-30)))
                tensors[name] = q
                rounded.append(name)
            else:
                kept += 1
        save_file(tensors, str(out / shard.name), metadata=meta)
        _say(progress, f"evalkit:   rounded {len(rounded)} linear weights through FP8 E4M3 ({shard.name})")
    missing = sorted(targets - set(rounded))
    if not rounded:
        raise VariantError(str(hf_dir), "found no linear weights to round (checkpoint names do not match the model's modules)")
    return {
        "emulation": True,
        "description": "FP8 weight rounding emulated in 16-bit (evalkit variant): each linear weight rounded "
        "through FP8 E4M3 with a per-output-channel scale and stored back in bfloat16. Numerically what "
        "vLLM's weight-only FP8 (Marlin, W8A16) computes with; activations stay 16-bit. Not real FP8 "
        "storage or FP8 compute.",
        "fp8_format": "float8_e4m3fn, max 448, scale = amax(row)/448 per output channel (fp32, applied in the 16-bit dtype)",
        "rounded": "decoder nn.Linear weights (attention q/k/v/o and MLP projections); not embeddings, norms or "
        "lm_head (vLLM does not quantize them either: lm_head is excluded from FP8, embeddings are not linear layers)",
        "from_hf": str(hf_dir),
        "n_rounded": len(rounded),
        "n_kept": kept,
        "not_found": missing,
        "mean_relative_error": round(sum(rel_err) / len(rel_err), 6),
        "dtype": ",".join(sorted(dtypes)),
        "model_file": ".",
    }


def _build_native_fp8(hf_dir: Path, out: Path) -> dict[str, Any]:
    """The `fp8` variant: the hf checkpoint's own files (hard links where the filesystem allows), marked so the
    hf engine quantizes its linear layers to FP8 at load, on the GPU that will compute with them (as vLLM's
    online fp8 does from a 16-bit checkpoint): the rounding then happens where the FP8 kernels are, and no
    second 16-bit copy of the weights is stored."""
    for f in hf_dir.iterdir():
        if f.is_file() and f.name != PROVENANCE:
            try:
                os.link(f, out / f.name)
            except OSError:
                shutil.copy2(f, out / f.name)
    return {
        "emulation": False,
        "description": "native FP8 (W8A8) on the hf engine: at load, every decoder linear weight is rounded to FP8 "
        "E4M3 with a per-output-channel scale and every activation entering it to E4M3 with a dynamic per-token "
        "scale; matmuls run on FP8 tensor cores through torch._scaled_mm (compute capability 8.9 or later, "
        "refused elsewhere). Embeddings, norms and lm_head stay 16-bit.",
        "quantize_at_load": True,
        "from_hf": str(hf_dir),
        "model_file": ".",
    }


def linear_weight_names(hf_dir: Path) -> set[str]:
    """Checkpoint names of the weights fp8-weight rounds: every nn.Linear except the output head.

    The model is built on the meta device (no memory) just to see which modules are linear layers.
    """
    torch, transformers = _require_transformers(str(hf_dir))
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    return {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    }


# ---------------------------------------------------------------------------------------------- GGUF ladder


# ---------------------------------------------------------------------------------------------- helpers


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def _write_json(path: Path, data: Any) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m evalkit.variants prepare SOURCE [VARIANT] [--force] [--quiet]`: prints the prepared path."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m evalkit.variants")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="make one variant of a model source")
    p.add_argument("source")
    p.add_argument("variant", nargs="?", help=f"{', '.join(VARIANTS)}, or gptq-w4g64, gptq-w8g64, awq-w4g64, w8a8-int8")
    p.add_argument("--calibration", help="text file a GPTQ/AWQ/W8A8 variant is calibrated on (default: evalkit's)")
    p.add_argument("--samples", type=int, help="calibration windows (default 32)")
    p.add_argument("--seq-len", type=int, help="tokens per calibration window (default 256)")
    p.add_argument("--force", action="store_true")
    p.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        calib = calibration_from(args.calibration, args.samples, args.seq_len)
        print(prepare_variant(args.source, args.variant, force=args.force, progress=not args.quiet, calibration=calib))
    except EvalkitError as e:
        print(f"evalkit: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
