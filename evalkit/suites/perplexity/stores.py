"""Where the KLD reference's full distributions live: its chunk stores in the run directory, its tokenization of
the text beside them, and the stores kept in the result cache (content-addressed)."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

from evalkit.fileio import atomic_write_bytes
from evalkit.metrics.kld import bytes_per_token_bound

STORE_DIR = "distributions"  # run_dir/distributions/<reference>/<chunk id>.evkld


STORE_SUFFIX = ".evkld"


def store_dir(run_dir: Path, reference: str) -> Path:
    return run_dir / STORE_DIR / reference


def reference_tokens_path(store: Path, text_sha: str) -> Path:
    """The KLD reference's tokenization of the whole text (int32 .npy, BOS first), beside its chunk stores:
    its readers score these ids. Streaming KLD never deletes it (4 bytes per token of the text)."""
    return store / f"tokens-{text_sha[:16]}.npy"


def write_reference_tokens(store: Path, text_sha: str, tokens: list[int]) -> None:
    buf = io.BytesIO()
    np.save(buf, np.asarray(tokens, dtype="<i4"))
    atomic_write_bytes(reference_tokens_path(store, text_sha), buf.getvalue())


def store_bytes_upper_bound(n_tokens: int, vocab: int) -> int:
    """Most bytes the reference's store can take for `n_tokens` scored tokens (the dense layout: llama.cpp's
    2 bytes per vocabulary id); the bitmap layout takes less whenever the distribution has a long tail."""
    return n_tokens * bytes_per_token_bound(vocab)


def kept_stores_dir() -> Path:
    from evalkit.models import cache_dir

    return cache_dir() / "kld-stores"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
