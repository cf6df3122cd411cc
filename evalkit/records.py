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

import sys
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from evalkit.engines.base import Engine, GenResult, utc_now
from evalkit.errors import RunDirError
from evalkit.suites import all_specs, registry_state

SCHEMA_VERSION = 3


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
    """Fields every record has. Frozen: a record is what was measured, not a working copy.

    A record type whose layout changed at a version upgrades its own lines: `from_v2(raw) -> raw` (version 2 to 3;
    e.g. `nested_generation`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    suite: str
    item_id: str
    category: str
    deployment: str | None = None  # the file a record lives in names it; written for standalone use
    cached: bool = False
    measured_at: str | None = None

    @classmethod
    def from_v2(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return raw


# -- the generation part, shared by every suite that generates ---------------------------------


class Generation(BaseModel):
    """What one generation request gave (the output side of evalkit.engines.base.GenResult): the text, its token
    ids, why it stopped, and when (seconds from the engine call's start to the first token and to the last).

    Every generating suite's record carries it as `generation` (version 3; before, each suite copied these fields
    into its own shape: flat, or long context's `timings`, upgraded when read)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output_text: str | None = None  # None only in cost records written before version 3 (they kept no text)
    output_token_ids: list[int]
    finish_reason: str
    ttft_s: float | None = None
    total_s: float

    @classmethod
    def of(cls, result: GenResult) -> "Generation":
        return cls(output_text=result.output_text, output_token_ids=list(result.output_token_ids),
                   finish_reason=result.finish_reason, ttft_s=result.ttft_s, total_s=result.total_s)

    @property
    def text(self) -> str:
        """The output text ("" where none was kept)."""
        return self.output_text or ""

    @property
    def n_output_tokens(self) -> int:
        return len(self.output_token_ids)


_GENERATION_FIELDS = ("output_text", "output_token_ids", "finish_reason", "ttft_s", "total_s")


def nested_generation(raw: dict[str, Any], drop: Sequence[str] = ("n_output_tokens",)) -> dict[str, Any]:
    """A version-2 line's generation fields (flat on the record, or in long context's `timings`) nested as its
    `generation` (version 3); `drop`: fields of the old layout the part makes redundant (token counts). A line
    with no generation (a skipped item) is returned as it is."""
    if "generation" in raw or "output_token_ids" not in raw:
        return dict(raw)
    data = dict(raw)
    timings = data.pop("timings", None) or {}
    generation = {k: data.pop(k) for k in _GENERATION_FIELDS if k in data}
    generation.update({k: timings[k] for k in ("ttft_s", "total_s") if k in timings})
    for k in drop:
        data.pop(k, None)
    data["generation"] = generation
    return data


# -- the record types: every registered suite's (SuiteSpec.records) -------------------------------


def record_types() -> dict[str, type[Record]]:
    """suite name -> its record type, from the suite registry (evalkit.suites: each spec's `records`)."""
    state = registry_state()
    if state not in _RECORD_TYPES:
        types: dict[str, type[Record]] = {}
        for spec in all_specs():
            for rtype in spec.records:
                if not issubclass(rtype, Record):  # SuiteSpec (below records) cannot check this itself
                    raise TypeError(f"suite {spec.name!r}: record type {rtype.__name__} is not an evalkit.records.Record")
                types[spec.name] = rtype
        _RECORD_TYPES[state] = types
    return _RECORD_TYPES[state]


_RECORD_TYPES: dict[tuple[tuple[str, str], ...], dict[str, type[Record]]] = {}


def __getattr__(name: str) -> Any:
    """A suite's record type (or a model it nests) by its class name, where evalkit once defined them all
    (`from evalkit.records import PromptRecord`): now in the suite's module, found through the registry."""
    if name.startswith("__"):  # the import system's probes (`__path__` on every `from module import x`): loading
        raise AttributeError(name)  # every suite for them would import suites that import this module: a cycle
    for spec in all_specs():
        module = sys.modules[spec.suite_class.__module__]
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _upgrade_v0(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0: the unversioned layout. Same fields, minus the provenance every record now carries.

    Only the cost suite recorded `cached`/`measured_at`; for the others the result is taken as fresh and
    its time as unknown (nothing in a v0 record says otherwise).
    """
    return {**raw, "schema_version": 1, "cached": bool(raw.get("cached", False)), "measured_at": raw.get("measured_at")}


def _upgrade_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 1: per-token arrays inline in the record (version 2 moved them to side files; a version-1 record
    keeps them inline in memory, where its suite's reader finds them). Every other record is unchanged."""
    return {**raw, "schema_version": 2}


def _upgrade_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 2: generating suites copied the generation into their own fields; version 3 nests it as one
    `Generation` part. Each record type says how (`Record.from_v2`)."""
    suite = raw.get("suite")
    rtype = record_types().get(suite) if isinstance(suite, str) else None
    data = rtype.from_v2(raw) if rtype is not None else dict(raw)
    return {**data, "schema_version": 3}


UPGRADES = {0: _upgrade_v0, 1: _upgrade_v1, 2: _upgrade_v2}  # version -> function producing version + 1


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
    suite = data.get("suite")
    rtype = record_types().get(suite) if isinstance(suite, str) else None
    if rtype is None:
        raise RunDirError(where, f"record of unknown suite {data.get('suite')!r} (item {data.get('item_id')!r})")
    try:
        return rtype.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(record)"
        raise RunDirError(where, f"{data['suite']} record {data.get('item_id')!r}: {loc}: {err['msg']}") from None


def parse_current_line(raw: bytes, head: tuple[int, str, str] | None) -> Record | None:
    """A records line of the current schema parsed straight from its bytes (pydantic's JSON parser: no
    intermediate dict, about half the time of json.loads + model_validate); None where that does not apply or
    fails (an older layout, an unknown suite, anything invalid), and the caller takes `parse_record`'s path,
    which gives the same record or names the problem."""
    if head is None or head[0] != SCHEMA_VERSION:
        return None
    rtype = record_types().get(head[1])
    if rtype is None:
        return None
    try:
        return rtype.model_validate_json(raw)
    except ValueError:  # ValidationError, or bytes that are not UTF-8
        return None


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
