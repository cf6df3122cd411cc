"""The engine side: one chunk's measurement (NLL, top-k, full distributions against a store) and its side file,
through the result cache (`evalkit.cache.cached_measurement`)."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from evalkit.cache import Measured, cached_measurement, keeps_measurements, uncached_engine
from evalkit.engines import gives_full_distributions
from evalkit.engines.base import Engine
from evalkit.metrics.kld import FORMAT_VERSION as KLD_FORMAT
from evalkit.metrics.kld import DistributionReader, DistributionWriter, StoreMismatch, kld_against
from evalkit.metrics.likelihood import (
    nll_and_topk,
)
from evalkit.suites.perplexity.records import token_dtype
from evalkit.sidefiles import SideFile
from evalkit.suites.perplexity.chunking import LOGPROB_DECIMALS
from evalkit.suites.perplexity.stores import STORE_SUFFIX, file_sha256, kept_stores_dir

ARRAYS_FORMAT = 2  # the side-file layout in cache keys: a change re-measures instead of misreading


Distributions = Callable[[list[int], int], Iterator[tuple[int, np.ndarray]]]


def distribution_source(engine: Engine) -> Distributions | None:
    """`token_distributions` of an engine whose spec declares FULL_DISTRIBUTION, else None.

    Reads the capability from the engine's spec (not hasattr: a lazy engine would load to answer)."""
    try:
        full = gives_full_distributions(engine.info().engine)
    except Exception:  # an engine outside the registry (test doubles): no full distributions
        return None
    if not full:
        return None

    def source(tokens: list[int], first: int) -> Iterator[tuple[int, np.ndarray]]:
        return engine.token_distributions(tokens, first)  # wrappers pass it through (a lazy engine loads here)

    return source


@dataclass(frozen=True)
class ChunkSpan:
    """One chunk as measured: its token ids, the index of its first scored token, the top-k log-probs kept per
    token (0: none) and the vocabulary's size."""

    chunk: list[int]
    first: int
    top_k: int
    vocab: int


def cached_chunk_span(engine: Engine, span: ChunkSpan) -> Measured:
    """NLL (and top-k where a bound reads it) of chunk[first:] from `Engine.score_span`, through the cache."""
    chunk, first, top_k = span.chunk, span.first, span.top_k
    payload = {"token_ids": chunk, "first": first, "top_k": top_k, "arrays": ARRAYS_FORMAT}

    def compute() -> tuple[dict[str, Any], SideFile]:
        # The engine's own call, not its cache wrapper's: the wrapper would keep the top-k lists as JSON.
        nll, ids, lps = uncached_engine(engine).score_span_arrays(chunk, first, top_k)
        return _arrays(span, nll, **({"ids": ids, "lps": lps} if top_k else {}))

    return cached_measurement(engine, "perplexity_chunk", payload, compute)


def _arrays(span: ChunkSpan, nll: np.ndarray, *, ids: np.ndarray | None = None, lps: np.ndarray | None = None,
            argmax: np.ndarray | None = None, kld: np.ndarray | None = None, same_top: np.ndarray | None = None
            ) -> tuple[dict[str, Any], SideFile]:
    """The record's scalars and side file of one chunk (only the fields given are written)."""
    chunk, first, top_k, vocab = span.chunk, span.first, span.top_k, span.vocab
    fields = ["token", "nll"] + [f for f, v in (("argmax", argmax), ("kld", kld), ("same_top", same_top)) if v is not None]
    if top_k:
        fields += ["top_ids", "top_lp"]
    out = np.zeros(len(nll), dtype=token_dtype(fields, top_k, vocab))
    out["token"] = chunk[first:]
    out["nll"] = nll
    for name, v in (("argmax", argmax), ("kld", kld), ("same_top", same_top)):
        if v is not None:
            out[name] = v
    if top_k:
        assert ids is not None and lps is not None
        if out["top_ids"].dtype.kind != "i":  # unsigned ids: a short row's padding is id 0 (its log-prob -inf)
            ids = np.where(ids < 0, 0, ids)
        out["top_ids"], out["top_lp"] = ids[:, :top_k], lps[:, :top_k]
    scalars: dict[str, Any] = {"n_scored": int(len(nll)), "nll_sum": float(out["nll"].astype(np.float64).sum()), "top_k": top_k}
    if kld is not None:
        scalars["kld_sum"] = float(out["kld"].astype(np.float64).sum())
    return scalars, SideFile.of(out)


def cached_chunk_full(
    engine: Engine, distributions: Distributions, span: ChunkSpan, path: Path, *,
    write: bool, meta: dict[str, Any] | None = None, streaming: bool = False,
) -> Measured:
    """`score_chunk_full` through the engine-result cache (when the engine has one), so a re-run does not load
    the model: the reference's store is kept in the cache too (content-addressed) and copied back into the
    run; a deployment's result is keyed by the exact reference store it was compared with."""
    chunk, first, top_k = span.chunk, span.first, span.top_k
    payload: dict[str, Any] = {"token_ids": chunk, "first": first, "top_k": top_k, "store_format": KLD_FORMAT,
                               "arrays": ARRAYS_FORMAT}
    if not write:
        payload["reference_store_sha256"] = file_sha256(path)
    kind = "perplexity_reference_chunk" if write else "perplexity_kld_chunk"

    def kept(hit: dict[str, Any]) -> bool:
        """The reference's store is in the cache too: copied back into the run (else: a miss)."""
        if not write:
            return True
        src = kept_stores_dir() / f"{hit.get('store_sha256')}{STORE_SUFFIX}"
        if not src.is_file():
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.copy")
        shutil.copyfile(src, tmp)
        os.replace(tmp, path)
        return True

    def compute() -> tuple[dict[str, Any], SideFile]:
        scalars, side = score_chunk_full(distributions, span, path, write=write, meta=meta)
        if write and keeps_measurements(engine) and not streaming:
            digest = file_sha256(path)
            try:
                kept_stores_dir().mkdir(parents=True, exist_ok=True)
                tmp = kept_stores_dir() / f".{digest}.{os.getpid()}.tmp"
                shutil.copyfile(path, tmp)
                os.replace(tmp, kept_stores_dir() / f"{digest}{STORE_SUFFIX}")
            except OSError as e:
                print(f"evalkit: warning: KLD store not kept in the cache ({e.strerror})", file=sys.stderr, flush=True)
            scalars["store_sha256"] = digest
        return scalars, side

    return cached_measurement(engine, kind, payload, compute, kept)


def score_chunk_full(
    distributions: Distributions, span: ChunkSpan, path: Path, *, write: bool, meta: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], SideFile]:
    """One teacher-forced pass with full distributions: NLL (top-k only when `top_k`) of every scored token,
    and either the chunk's reference store written to `path` plus each token's argmax (`write`, the KLD
    reference) or each token's exact KL(P_ref || P_dep) against the store at `path` and whether its argmax
    is the reference's (every other deployment). Streams block by block."""
    chunk, first, top_k, vocab = span.chunk, span.first, span.top_k, span.vocab
    n = len(chunk) - first
    nll = np.empty(n)
    argmax = np.empty(n, dtype=np.int64)
    ids = np.zeros((n, top_k), dtype=np.int64)
    lps = np.zeros((n, top_k))
    kld = np.empty(n)
    same = np.zeros(n, dtype=bool)
    writer = DistributionWriter(path, vocab=vocab, token_ids=chunk, first=first, meta=meta) if write else None
    reader = None if write else DistributionReader(path, vocab=vocab, token_ids=chunk, first=first)
    ref_tokens = iter(reader) if reader is not None else None
    done = 0
    try:
        for start, rows in distributions(chunk, first):
            if rows.shape[1] != vocab:
                raise StoreMismatch(str(path), f"the engine gave {rows.shape[1]} log-probs per token, its vocabulary has {vocab}")
            m = rows.shape[0]
            if done + m > n:
                raise ValueError(f"engine gave more than {n} distributions for {n} scored tokens")
            b_nll, b_ids, b_lps = nll_and_topk(rows, chunk[start : start + m], max(top_k, 1), normalized=True)
            nll[done : done + m] = b_nll
            argmax[done : done + m] = b_ids[:, 0]
            if top_k:
                ids[done : done + m], lps[done : done + m] = b_ids[:, :top_k], b_lps[:, :top_k]
            if writer is not None:
                writer.write_rows(rows)
            if ref_tokens is not None:
                for j, row in enumerate(rows):
                    ref = next(ref_tokens)
                    kld[done + j] = kld_against(ref, row)
                    same[done + j] = ref.argmax == b_ids[j, 0]
            done += m
        if done != n:
            raise ValueError(f"engine gave {done} distributions for {n} scored tokens")
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if reader is not None:
            reader.close()
    extra: dict[str, Any] = {"ids": ids, "lps": lps} if top_k else {}
    if writer is not None:
        writer.close()
        scalars, side = _arrays(span, nll, argmax=argmax, **extra)
        scalars["store_bytes"] = writer.bytes
        return scalars, side
    return _arrays(span, nll, kld=kld, same_top=same, **extra)


def score_chunk(engine: Engine, chunk: list[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
    """NLL and top-k [[id, logprob], ...] of chunk[first:], each predicted from its prefix in the chunk
    (`Engine.score_span`: llama.cpp computes logits only for the scored rows; the default slices `score`),
    with the log-probs rounded for the records."""
    nll, top = engine.score_span(chunk, first, top_k)
    top = [[[int(t), round(float(lp), LOGPROB_DECIMALS)] for t, lp in row] for row in top]
    return [float(x) for x in nll], top
