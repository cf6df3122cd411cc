"""The perplexity suite's record: a scored chunk, its scalars in the records line and its per-token arrays in a
side file (`token_arrays`), and the side file's layout (`TOKEN_FIELDS`, `token_dtype`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evalkit.errors import RunDirError
from evalkit.records import Record
from evalkit.sidefiles import read_side_file


class PerplexityTimings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    score_s: float | None = None
    total_s: float | None = None


class PerplexityRecord(Record):
    """A scored chunk, or a placeholder past the end of the text (`skipped` set, nothing else).

    Version 2: the per-token arrays are in the side file `arrays_sha256` (see `token_arrays`; fields in
    `TOKEN_FIELDS`); the record keeps scalars. Version 1 (upgraded when read) had them inline as lists:
    `token_ids`, `nll`, `top`, `argmax`, `kld`, `ref_argmax`.
    """

    model_config = ConfigDict(extra="allow")  # the KLD work adds per-chunk fields; they travel untyped
    suite: Literal["perplexity"] = "perplexity"
    skipped: str | None = None
    chunk_index: int | None = None
    n_ctx: int | None = None
    bos_replaced: bool | None = None
    scored_from: int | None = None
    top_k: int | None = None
    n_bytes: int | None = None
    n_text_tokens: int | None = None
    text_sha256: str | None = None
    timings: PerplexityTimings | None = None
    # v2: sha256 of the chunk's token ids (int32 little-endian: evalkit.metrics.kld.tokens_sha256), scored
    # tokens, their NLL sum (a chunk's PPL without its side file), exact KLD sum, and the side file.
    tokens_sha256: str | None = None
    n_scored: int | None = None
    nll_sum: float | None = None
    kld_sum: float | None = None
    arrays_sha256: str | None = None
    arrays_bytes: int | None = None
    # The KLD reference's chunk store (bytes, sha256) and whose store a deployment's exact KLD read.
    store_bytes: int | None = None
    store_sha256: str | None = None
    kld_reference: str | None = None
    # Where the chunk's token ids are the KLD reference's (named) because this deployment's own tokenizer
    # splits the text differently there (a reader scores the reference's tokens).
    tokens_from: str | None = None
    # v1 only: the arrays inline.
    token_ids: list[int] | None = None
    nll: list[float] | None = None
    top: list[list[list[float]]] | None = None  # per scored position: [[token id, logprob], ...]
    argmax: list[int] | None = None
    kld: list[float] | None = None
    ref_argmax: list[int] | None = None
    # In memory only, between the suite and the writer (store.SIDE_KEY): the side file's bytes.
    side_file: Any = Field(default=None, exclude=True)

    @property
    def scored(self) -> bool:
        return self.skipped is None and (self.nll is not None or self.arrays_sha256 is not None)


# Per-token fields of a perplexity side file (one row per scored token). Only what a reader of that
# deployment needs is written: `argmax` by the KLD reference, `kld`/`same_top` by exact-KLD deployments,
# `top_ids`/`top_lp` where a top-k bound reads them (deployments without full distributions, and the run's
# reference when one of those runs).
TOKEN_FIELDS = ("token", "nll", "argmax", "kld", "same_top", "top_ids", "top_lp")


def token_dtype(fields: Sequence[str], top_k: int = 0, vocab: int | None = None) -> np.dtype:
    """The side file's structured dtype: nll and kld float32 (below float32 logit noise), token ids int32,
    top-k ids uint16 when the vocabulary fits in it, top-k log-probs float16 (the bound's own bias is
    percents; float16 rounding moves a per-token KLD by ~1e-7)."""
    ids = "<u2" if vocab is not None and vocab <= 65536 else "<i4"
    spec = {"token": "<i4", "nll": "<f4", "argmax": "<i4", "kld": "<f4", "same_top": "u1",
            "top_ids": (ids, (top_k,)), "top_lp": ("<f2", (top_k,))}
    return np.dtype([(f, *((spec[f],) if isinstance(spec[f], str) else spec[f])) for f in TOKEN_FIELDS if f in fields])


def token_arrays(record: "PerplexityRecord", run_dir: Path | None, where: str = "records") -> np.ndarray:
    """The per-token arrays of one scored perplexity record, as a numpy structured array (fields among
    `TOKEN_FIELDS`): v2 from its side file (memory-mapped) or the side file it still carries in memory; v1
    from its inline lists (nll and kld float64, top-k padded with id -1 / NaN)."""
    if record.side_file is not None:
        return record.side_file.array()
    if record.arrays_sha256 is not None:
        if run_dir is None:
            raise RunDirError(where, f"perplexity record {record.item_id!r} names a side file but no run directory was given")
        return read_side_file(run_dir, record.arrays_sha256, where=where)
    return _v1_arrays(record)


def _v1_arrays(r: "PerplexityRecord") -> np.ndarray:
    assert r.nll is not None and r.token_ids is not None and r.scored_from is not None
    n = len(r.nll)
    width = max((len(t) for t in r.top), default=0) if r.top else 0
    fields: list[tuple[Any, ...]] = [("token", "<i4"), ("nll", "<f8")]
    if r.argmax is not None:
        fields.append(("argmax", "<i4"))
    if r.kld is not None:
        fields.append(("kld", "<f8"))
    if r.argmax is not None and r.ref_argmax is not None:
        fields.append(("same_top", "u1"))
    if width:
        fields += [("top_ids", "<i8", (width,)), ("top_lp", "<f8", (width,))]
    out = np.zeros(n, dtype=np.dtype(fields))
    out["token"] = r.token_ids[r.scored_from : r.scored_from + n]
    out["nll"] = r.nll
    if r.argmax is not None:
        out["argmax"] = r.argmax
    if r.kld is not None:
        out["kld"] = r.kld
    if "same_top" in (out.dtype.names or ()):
        out["same_top"] = np.asarray(r.argmax) == np.asarray(r.ref_argmax)
    if width:
        ids = np.full((n, width), -1, dtype=np.int64)
        lps = np.full((n, width), np.nan)
        for i, row in enumerate(r.top or []):
            if row:
                a = np.asarray(row, dtype=np.float64)
                ids[i, : len(row)] = a[:, 0]
                lps[i, : len(row)] = a[:, 1]
        out["top_ids"], out["top_lp"] = ids, lps
    return out
