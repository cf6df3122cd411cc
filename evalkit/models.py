"""Model files: resolving `pkg:` and paths, checking formats, fingerprints (sha256, size)."""
from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import ModelFileError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelFile:
    path: Path
    kind: str  # "gguf" or "hf"
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
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ModelFileError(
            f"pkg:{name}", f"package {name!r} is not installed (pip install {name}, or 'evalkit[demo]')"
        ) from None
    if hasattr(module, "assemble"):  # chunked packages write the file once into the user's cache
        try:
            return Path(module.assemble())
        except FileExistsError:  # another process is mid-write (its sha256 does not match yet): wait once
            import time

            time.sleep(3)
            return Path(module.assemble())
    ggufs = sorted(Path(module.__file__).parent.rglob("*.gguf"))  # type: ignore[arg-type]
    if not ggufs:
        raise ModelFileError(f"pkg:{name}", "package ships no .gguf file")
    return ggufs[0]


def check_model(path: Path, source: str) -> str:
    """Validate the file format; returns 'gguf' or 'hf'. Raises ModelFileError with one clear line."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelFileError(str(path), "directory is not a Hugging Face checkpoint (no config.json)")
        try:
            json.loads((path / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelFileError(str(path / "config.json"), f"unreadable: {e}") from None
        return "hf"
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(str(path), f"cannot read: {e}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(str(path), f"not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    if path.stat().st_size < 1024:
        raise ModelFileError(str(path), "GGUF file is truncated")
    return "gguf"


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
    """sha256 and size, memoised on (path, size, mtime) within the process."""
    kind = "hf" if path.is_dir() else "gguf"
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    size = sum(p.stat().st_size for p in files)
    mtime = max(int(p.stat().st_mtime_ns) for p in files)
    key = (str(path.resolve()), size, mtime)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_of(path)
    return ModelFile(path=path, kind=kind, sha256=_SHA_CACHE[key], size_bytes=size)


def cache_dir() -> Path:
    """evalkit's cache (prepared variants, engine results): $EVALKIT_CACHE_DIR or the user cache dir."""
    env = os.environ.get("EVALKIT_CACHE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("evalkit"))
