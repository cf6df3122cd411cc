"""What a records line means: one typed, versioned record per suite item (the bytes are store.py's).

Every line of `records/<deployment>.jsonl` is `record.model_dump(mode="json")` of one of the classes
below, with `schema_version` on it. `parse_record` reads a line back as its typed record: lines written
before records were versioned (no `schema_version`, "version 0") are upgraded; a line from a newer
evalkit (a version this one does not know) is refused with a RunDirError naming the version.

`cached` says whether the engine result behind the record was served from evalkit's result cache;
`measured_at` is the UTC time the engine produced it: for a cache hit the time stored with the entry when
it was first measured, for a fresh result the time it was made. None only where that time is not known:
a cache entry stored before entries carried it, or a version-0 line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from evalkit.engines.base import Engine, utc_now  # noqa: F401  (utc_now: the suites' clock, re-exported)
from evalkit.errors import RunDirError
from evalkit.sidefiles import SideFile, read_side_file

SCHEMA_VERSION = 2


def provenance(result: Any) -> dict[str, Any]:
    """`cached` and `measured_at` of an engine result (GenResult/TokenScores carry both).

    A cache hit keeps the time stored with it (None: an entry from before entries kept it); a fresh result
    has the time the engine made it, or now when it has none.
    """
    cached = bool(getattr(result, "cached", False))
    measured_at = getattr(result, "measured_at", None)
    return {"cached": cached, "measured_at": measured_at if (measured_at or cached) else utc_now()}


def call_provenance(engine: Engine, count: int) -> list[dict[str, Any]]:
    """`cached`/`measured_at` of each of the `count` results of `engine`'s latest score_span /
    next_token_logprobs call, whose plain-list results cannot carry them (`Engine.last_call_provenance`:
    the result cache knows; an engine without one computed them all just now)."""
    log = engine.last_call_provenance()
    if log is None:
        now = utc_now()
        return [{"cached": False, "measured_at": now} for _ in range(count)]
    if len(log) != count:
        raise RuntimeError(f"engine reported provenance for {len(log)} results of its last call, expected {count}")
    return [{"cached": p.cached, "measured_at": p.measured_at} for p in log]


def combined(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The provenance of a record made from several engine results: cached only when every one was a cache
    hit; measured when the newest of them was (unknown when any time is unknown)."""
    times = [p["measured_at"] for p in parts]
    known = all(times) and bool(times)
    return {"cached": bool(parts) and all(p["cached"] for p in parts), "measured_at": max(times) if known else None}


class Record(BaseModel):
    """Fields every record has. Frozen: a record is what was measured, not a working copy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    suite: str
    item_id: str
    category: str
    deployment: str | None = None  # the file a record lives in names it; written for standalone use
    cached: bool = False
    measured_at: str | None = None


# -- prompts ------------------------------------------------------------------------------------


class PromptRecord(Record):
    suite: Literal["prompts"] = "prompts"
    prompt: str
    prompt_format: str
    prompt_token_ids: list[int]
    output_text: str
    output_token_ids: list[int]
    n_prompt_tokens: int
    n_output_tokens: int
    finish_reason: str
    ttft_s: float | None = None
    total_s: float
    reference: str | None = None
    target_lang: str | None = None
    item: dict[str, Any]  # the prompt-file line: everything scoring needs travels with the record


# -- perplexity ---------------------------------------------------------------------------------


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
    if "same_top" in out.dtype.names:
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


# -- mmlu ---------------------------------------------------------------------------------------


class MmluTimings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_s: float
    batch_size: int
    per_item_s: float


class MmluRecord(Record):
    suite: Literal["mmlu"] = "mmlu"
    prompt_token_ids: list[int]
    n_prompt_tokens: int
    prompt_sha256: str
    letter_token_ids: list[int] | None = None  # None: the letters were not single tokens
    method: Literal["one-pass", "four-continuations"]
    choice_logprobs: list[float]
    pred: str
    gold: str
    correct: bool
    timings: MmluTimings


# -- longcontext --------------------------------------------------------------------------------


class GenTimings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float | None = None
    total_s: float


class LongContextRecord(Record):
    """A repetition or recall item; `skipped` (with the reason) when its length does not fit."""

    suite: Literal["longcontext"] = "longcontext"
    kind: Literal["rep", "recall"]
    length_target: int
    depth: float | None = None
    passkey: str | None = None
    n_ctx: int | None = None  # absent from records written before it was recorded
    filler_repeats: int
    skipped: str | None = None
    needle_token_pos: int | None = None
    depth_actual: float | None = None
    n_prompt_tokens: int | None = None
    prompt_sha256: str | None = None
    output_text: str | None = None
    output_token_ids: list[int] | None = None
    n_output_tokens: int | None = None
    finish_reason: str | None = None
    timings: GenTimings | None = None
    correct: bool | None = None  # recall items only


# -- humaneval ----------------------------------------------------------------------------------


class HumanEvalRecord(Record):
    suite: Literal["humaneval"] = "humaneval"
    prompt: str
    prompt_token_ids: list[int]
    output_text: str
    output_token_ids: list[int]
    finish_reason: str
    ttft_s: float | None = None
    total_s: float
    entry_point: str | None = None  # records written before they carried their task: completed from the data
    test: str | None = None


# -- cost ---------------------------------------------------------------------------------------


class CostRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    ttft_s: float | None = None
    total_s: float
    prompt_token_ids: list[int]
    output_token_ids: list[int]


class CostRecord(Record):
    """One (concurrency level, repeat) measurement; `cached` when a re-run reused a stored measurement."""

    suite: Literal["cost"] = "cost"
    concurrency: int
    repeat: int
    prompt_tokens: int
    output_tokens_requested: int
    ignore_eos: bool
    prompt_construction: str
    wall_s: float
    requests: list[CostRequest]
    baseline_rss_mb: float
    peak_rss_mb: float  # MiB, sampled during this level
    worker_peak_rss_mb: float | None = None  # MiB, the worker's process-tree high-water (VmHWM) up to this level
    server_peak_rss_mb: float | None = None  # MiB, high-water of a server evalkit started for the deployment
    gpu: list[dict[str, Any]] | None = None
    # The memory-bandwidth bound of decode: {bytes_per_s, source, weights_bytes, device} (absent before it was recorded)
    bandwidth: dict[str, Any] | None = None
    startup_s: float
    warmup_s: float
    engine: str
    engine_version: str
    n_ctx: int | None = None  # absent from records written before it was recorded
    n_threads: int | None = None
    sampling: dict[str, Any]


AnyRecord = Annotated[
    Union[PromptRecord, PerplexityRecord, MmluRecord, LongContextRecord, HumanEvalRecord, CostRecord],
    Field(discriminator="suite"),
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(AnyRecord)
RECORD_TYPES: dict[str, type[Record]] = {
    "prompts": PromptRecord, "perplexity": PerplexityRecord, "mmlu": MmluRecord,
    "longcontext": LongContextRecord, "humaneval": HumanEvalRecord, "cost": CostRecord,
}


def _upgrade_v0(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0: the unversioned layout. Same fields, minus the provenance every record now carries.

    Only the cost suite recorded `cached`/`measured_at`; for the others the result is taken as fresh and
    its time as unknown (nothing in a v0 record says otherwise).
    """
    return {**raw, "schema_version": 1, "cached": bool(raw.get("cached", False)), "measured_at": raw.get("measured_at")}


def _upgrade_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 1: perplexity arrays inline (they stay inline in memory: `token_arrays` reads them there).
    Every other suite's record is unchanged."""
    return {**raw, "schema_version": 2}


UPGRADES = {0: _upgrade_v0, 1: _upgrade_v1}  # version -> function producing version + 1


def parse_record(raw: dict[str, Any], where: str = "records") -> Record:
    """A records line as its typed record, upgrading older layouts; RunDirError on what cannot be read."""
    version = raw.get("schema_version", 0)
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 0:
        raise RunDirError(where, f"records schema_version {version!r} is newer than this evalkit reads "
                                 f"(up to {SCHEMA_VERSION}); upgrade evalkit to read this run")
    data = dict(raw)
    while version < SCHEMA_VERSION:
        data = UPGRADES[version](data)
        version += 1
    if data.get("suite") not in RECORD_TYPES:
        raise RunDirError(where, f"record of unknown suite {data.get('suite')!r} (item {data.get('item_id')!r})")
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"][1:]) or "(record)"
        raise RunDirError(where, f"{data['suite']} record {data.get('item_id')!r}: {loc}: {err['msg']}") from None


def typed(records: Mapping[str, Sequence[Record | dict[str, Any]]]) -> dict[str, list[Any]]:
    """deployment -> records, each parsed to its type (already typed records pass through).

    Suites call this first in score/compare/item_rows, so callers may hand them raw records lines.
    """
    return {dep: [r if isinstance(r, Record) else parse_record(r, f"records/{dep}.jsonl") for r in recs]
            for dep, recs in records.items()}


def dump_record(record: Record) -> dict[str, Any]:
    """The JSON-able form written as one records line.

    Fields that are None are left out (every such field defaults to None when read back), so a line
    has only what was measured: a skipped long-context item has `skipped` and no output fields.
    """
    return record.model_dump(mode="json", exclude_none=True)
