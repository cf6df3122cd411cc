"""Model fingerprints are memoised across processes in the cache, and a changed file is hashed again."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from evalkit import models


def test_fingerprint_is_remembered_across_processes_until_the_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\1" * 4000)
    first = models.fingerprint(model)
    assert first.sha256 == hashlib.sha256(model.read_bytes()).hexdigest() and first.size_bytes == 4004

    monkeypatch.setattr(models, "_SHA_CACHE", {})  # a new process: only the cache remembers
    real_sha256_of = models.sha256_of

    def no_hashing(path: Path) -> str:
        raise AssertionError("hashed again")

    monkeypatch.setattr(models, "sha256_of", no_hashing)
    assert models.fingerprint(model).sha256 == first.sha256

    # Same size, same mtime (set back by hand), other bytes: the ctime moved, so it is hashed again.
    st = model.stat()
    time.sleep(0.01)
    model.write_bytes(b"GGUF" + b"\2" * 4000)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.setattr(models, "_SHA_CACHE", {})
    monkeypatch.setattr(models, "sha256_of", real_sha256_of)
    assert models.fingerprint(model).sha256 == hashlib.sha256(model.read_bytes()).hexdigest() != first.sha256


def test_a_broken_memo_entry_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALKIT_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\3" * 2000)
    sha = models.fingerprint(model).sha256
    (entry,) = (tmp_path / "cache" / "fingerprints").iterdir()
    entry.write_text('{"key": [], "sha256": "0"}', encoding="utf-8")  # another key, a bad hash
    monkeypatch.setattr(models, "_SHA_CACHE", {})
    assert models.fingerprint(model).sha256 == sha == hashlib.sha256(model.read_bytes()).hexdigest()
