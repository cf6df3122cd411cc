"""Exact KL-divergence against a stored reference: the compact distribution store and the per-token math.

The reference deployment's full next-token distributions are written once per perplexity chunk
(`DistributionWriter`); every other deployment streams them back (`DistributionReader`) beside its own
distributions and computes KL(P_ref || P_dep) token by token (`kld_against`). Nothing holds more than
one block of rows, so memory stays flat whatever the text length.

Per scored token the store keeps what llama.cpp's `--kl-divergence-base` file keeps, more compactly and
more precisely:

- every log-probability within `WINDOW` nats of the token's maximum (llama.cpp: 16), as a uint16 step
  of WINDOW/65534 nats above the window floor (value 0 = below the window); stored densely (2 bytes per
  vocabulary entry, llama.cpp's layout) or, when shorter, as a vocabulary bitmap plus the kept values;
- the exact probability mass below the window (float64) and the exact argmax id;
- the `EXACT_TOP` most probable ids with their float32 log-probs, which replace their rounded values
  (they carry most of the mass, so rounding error left elsewhere is weighted by small probabilities).

KLD from the store: the dequantized kept probabilities are renormalized to 1 - tail (which cancels the
rounding to first order: the remaining error is second order, ~1e-8 per token), every kept id counts
(llama.cpp drops every term with p_ref < e^-16), and the mass below the window is one bucket against the
deployment's own mass on those ids (log-sum inequality; < e^-24 per id, so its share is negligible).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

import numpy as np

from evalkit.errors import DataError

MAGIC = b"EVKLD01\n"
FORMAT_VERSION = 1
WINDOW = 24.0  # nats below the maximum log-prob that are kept individually (llama.cpp: 16)
LEVELS = 65534  # uint16 steps over the window; 0 marks "below the window"
EXACT_TOP = 32  # ids per token whose log-prob is stored unrounded (float32)
# Fixed part of each token: argmax id, count of kept ids, window floor, step, mass below the window, layout.
TOKEN_HEADER = np.dtype([("argmax", "<i4"), ("n_kept", "<u4"), ("lo", "<f8"), ("scale", "<f8"),
                         ("tail", "<f8"), ("dense", "<u4"), ("n_top", "<u4")])


def tokens_sha256(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(token_ids, dtype="<i4").tobytes()).hexdigest()


def bytes_per_token_bound(vocab: int) -> int:
    """Upper bound on one token's stored size (the dense layout): llama.cpp's 2 bytes per id + header."""
    return TOKEN_HEADER.itemsize + 8 * EXACT_TOP + 2 * vocab


@dataclass(frozen=True)
class EncodedToken:
    """One reference token as stored (see the module docstring)."""

    argmax: int
    lo: float  # log-prob of step value 1 (the window floor)
    scale: float  # nats per step
    tail: float  # exact probability mass of ids below the window
    kept: np.ndarray  # bool (vocab,): ids with their own value
    steps: np.ndarray  # uint16 (n_kept,): values of the kept ids, ascending id order
    top_ids: np.ndarray  # int32 (EXACT_TOP,): the most probable ids (all kept)
    top_lp: np.ndarray  # float32: their log-probs, unrounded

    def logprobs(self) -> np.ndarray:
        """Dequantized log-probs of the kept ids, renormalized so they and the tail sum to 1 (float64)."""
        return self.distribution()[0]

    def distribution(self) -> tuple[np.ndarray, np.ndarray]:
        """(log-probs, probabilities) of the kept ids, renormalized to 1 - tail; one exp pass."""
        lp = self.lo + (self.steps.astype(np.float64) - 1.0) * self.scale
        if self.top_ids.size:
            lp[np.searchsorted(np.flatnonzero(self.kept), self.top_ids)] = self.top_lp
        p = np.exp(lp)
        total = float(p.sum())
        if total > 0:
            norm = (1.0 - self.tail) / total
            lp += math.log(norm)
            p *= norm
        return lp, p


def encode_row(logprobs: np.ndarray) -> EncodedToken:
    """Compress one full-vocabulary log-softmax row (float32 or float64)."""
    row = np.asarray(logprobs)
    top = int(np.argmax(row))
    hi = float(row[top])
    lo = hi - WINDOW
    kept = row >= lo
    below = row[~kept]
    tail = float(np.exp(below.astype(np.float64)).sum()) if below.size else 0.0
    scale = WINDOW / (LEVELS - 1)
    steps = (np.rint((row[kept].astype(np.float64) - lo) / scale) + 1.0).astype(np.uint16)
    n_top = min(EXACT_TOP, int(steps.size))
    top_ids = np.sort(np.argpartition(row, -n_top)[-n_top:]).astype(np.int32) if n_top else np.zeros(0, np.int32)
    return EncodedToken(top, lo, scale, tail, kept, steps, top_ids, row[top_ids].astype(np.float32))


class DistributionWriter:
    """Streams encoded tokens of one chunk to `path` (written to a temporary name, renamed on `close`, so
    a crash never leaves a partial store that a deployment would read)."""

    def __init__(self, path: Path, *, vocab: int, token_ids: Sequence[int], first: int, meta: dict | None = None) -> None:
        self.path = path
        self.vocab = vocab
        self.n_tokens = len(token_ids) - first
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: BinaryIO = open(self._tmp, "wb")
        head = {"version": FORMAT_VERSION, "vocab": vocab, "n_tokens": self.n_tokens, "first": first,
                "window": WINDOW, "tokens_sha256": tokens_sha256(token_ids), **(meta or {})}
        blob = json.dumps(head, sort_keys=True).encode()
        self._f.write(MAGIC + struct.pack("<I", len(blob)) + blob)
        self._written = 0
        self.bytes = 0

    def write_rows(self, logprobs: np.ndarray) -> list[int]:
        """Encode rows (n, vocab); returns each row's argmax."""
        out = []
        for row in np.atleast_2d(logprobs):
            t = encode_row(row)
            self._write(t)
            out.append(t.argmax)
        return out

    def _write(self, t: EncodedToken) -> None:
        n_kept = int(t.steps.size)
        bitmap_bytes = (self.vocab + 7) // 8
        dense = bitmap_bytes + 2 * n_kept >= 2 * self.vocab
        h = np.array([(t.argmax, n_kept, t.lo, t.scale, t.tail, int(dense), t.top_ids.size)], dtype=TOKEN_HEADER)
        parts = [h.tobytes(), t.top_ids.astype("<i4").tobytes(), t.top_lp.astype("<f4").tobytes()]
        if dense:
            full = np.zeros(self.vocab, dtype="<u2")
            full[t.kept] = t.steps
            parts.append(full.tobytes())
        else:
            parts.append(np.packbits(t.kept, bitorder="little").tobytes())
            parts.append(t.steps.astype("<u2").tobytes())
        for p in parts:
            self._f.write(p)
            self.bytes += len(p)
        self._written += 1

    def close(self) -> None:
        self._f.close()
        if self._written != self.n_tokens:
            self._tmp.unlink(missing_ok=True)
            raise ValueError(f"distribution store {self.path}: {self._written} tokens written, {self.n_tokens} expected")
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)


class StoreMismatch(DataError):
    """The stored reference was made for other tokens, another vocabulary or another format."""


class DistributionReader:
    """Reads one chunk's stored reference token by token."""

    def __init__(self, path: Path, *, vocab: int, token_ids: Sequence[int], first: int) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "rb")
        if self._f.read(len(MAGIC)) != MAGIC:
            self._f.close()
            raise StoreMismatch(str(path), "not an evalkit distribution store")
        (size,) = struct.unpack("<I", self._f.read(4))
        self.meta = json.loads(self._f.read(size))
        want = {"version": FORMAT_VERSION, "vocab": vocab, "first": first, "tokens_sha256": tokens_sha256(token_ids)}
        bad = [k for k, v in want.items() if self.meta.get(k) != v]
        if bad:
            self._f.close()
            raise StoreMismatch(str(path), f"the stored reference differs in {', '.join(bad)}" + (
                " (the KLD reference's tokenizer split this chunk differently and this run has no list of its tokens"
                " for the readers to score: re-run the reference)" if "tokens_sha256" in bad else ""))
        self.vocab = vocab
        self.n_tokens = int(self.meta["n_tokens"])

    def __iter__(self) -> Iterator[EncodedToken]:
        bitmap_bytes = (self.vocab + 7) // 8
        for _ in range(self.n_tokens):
            h = np.frombuffer(self._f.read(TOKEN_HEADER.itemsize), dtype=TOKEN_HEADER)[0]
            n_kept, n_top = int(h["n_kept"]), int(h["n_top"])
            top_ids = np.frombuffer(self._f.read(4 * n_top), dtype="<i4")
            top_lp = np.frombuffer(self._f.read(4 * n_top), dtype="<f4")
            if h["dense"]:
                full = np.frombuffer(self._f.read(2 * self.vocab), dtype="<u2")
                kept = full > 0
                steps = full[kept]
            else:
                kept = np.unpackbits(np.frombuffer(self._f.read(bitmap_bytes), dtype=np.uint8),
                                     count=self.vocab, bitorder="little").view(bool)
                steps = np.frombuffer(self._f.read(2 * n_kept), dtype="<u2")
            yield EncodedToken(int(h["argmax"]), float(h["lo"]), float(h["scale"]), float(h["tail"]), kept, steps,
                               top_ids, top_lp)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "DistributionReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kld_against(ref: EncodedToken, logprobs: np.ndarray) -> float:
    """KL(P_ref || P_dep) for one token: `logprobs` is the deployment's full log-softmax row."""
    q = np.asarray(logprobs)
    lp_ref, p_ref = ref.distribution()
    # Not np.dot: numpy's BLAS splits a dot product over threads, and on a busy machine their hand-off costs ~8 ms
    # per call (measured: 2 cores, load 5), 1000x the product itself.
    kld = float((p_ref * (lp_ref - q[ref.kept])).sum())
    if ref.tail > 0:
        q_tail = float(np.exp(q[~ref.kept]).sum(dtype=np.float64))
        kld += ref.tail * (math.log(ref.tail) - math.log(max(q_tail, 1e-300)))
    return kld
