"""The engine-result cache: every engine call's result on disk, keyed by everything that can change it.

A key is the sha256 of: the model file's content hash (not its name), the variant, the engine's name,
version and backend, the engine options that change numerics (the engine spec's allow-list), the exact
prompt token ids, the sampling parameters and the call kind (generate / score(top_k) /
next_token_logprobs(candidates)). One JSON file per entry, sharded by the key's first two hex digits,
written atomically (temp file + fsync + rename): a process killed mid-write leaves at most a stray temp
file, which is never read. An unreadable or mismatching entry is a miss and is overwritten. An entry of an
engine result also keeps when the engine measured it (`measured_at`), so a result served from the cache says
when its numbers were made (`GenResult` / `TokenScores` carry it; `last_call_provenance` for plain lists).

Timing-sensitive work (the cost suite) must not be served from here as engine calls: it calls
`engine.uncached()`. It may store whole measurements (`CachedEngine.measurement` / `store_measurement`),
which it marks as such when reused (see evalkit/suites/cost.py); only the worker's engine enables that.

A re-run starts no engine for what is cached (`open_engine`, the worker's entry point): the engine's
description (`EngineInfo`, which feeds the key) is stored on first load under the deployment's identity
(model content hash, path, variant, engine package version, all options, host), tokenization results are
memoised under the same identity, and a `LazyEngine` loads a tokenizer-only stand-in
(evalkit/engines/tokenizer.py) on the first tokenization miss and the real engine on the first result
miss. An identity the stored description does not match (e.g. a GPU swapped under the same host name) is
caught when the real engine loads: the description is refreshed and later keys use it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from evalkit.engines import load_engine
from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, Provenance, SamplingParams, TokenScores, utc_now
from evalkit.models import cache_dir, fingerprint
from evalkit.store import atomic_write_text

if TYPE_CHECKING:
    from evalkit.sidefiles import SideFile

FORMAT = 1  # bump when the entry layout or key recipe changes: old entries then simply miss

def numerics_options(engine: str, options: Any) -> dict[str, Any]:
    """The engine options that can change a result (its spec's `numerics_options`), from a pydantic options
    model or a dict. Everything else (threads, memory shares, templates: the template's effect is already
    in the prompt token ids) is left out so it can change freely without losing the cache."""
    from evalkit.engines import engine_spec

    values = options.model_dump() if hasattr(options, "model_dump") else dict(options or {})
    spec = engine_spec(engine)
    out = {k: values.get(k) for k in spec.numerics_options if k in values}
    return spec.effective_numerics(out) if spec.effective_numerics is not None else out


def key_parts_for(
    engine: str,
    model_sha256: str,
    variant: str | None,
    options: Any,
    engine_version: str,
    backend: str | None = None,
    replicate: int = 0,
) -> dict[str, Any]:
    """Everything about a deployment that the cache key must include (besides the request itself).

    `replicate` > 0 keys a deliberate re-run (the noise-floor run of the reference) apart from the first.
    """
    return {
        "format": FORMAT,
        "model_sha256": model_sha256,  # content, not name: a re-downloaded or renamed file still hits
        "variant": variant,
        "engine": engine,
        "engine_version": engine_version,
        "backend": backend,  # e.g. llama.cpp's CPU feature flags: different kernels, different rounding
        "options": numerics_options(engine, options),
        "replicate": replicate,
    }


def model_identity(info: EngineInfo, model_sha256: str | None) -> str:
    """What the cache key says the model is: the weights' sha256 when known; for a served model whose weights
    are not named, a hash of what its server reports (`EngineInfo.extra["model_identity"]`: model id, server
    version, fingerprint), prefixed "served:" (the weights are not verified); else the model file's hash."""
    if model_sha256:
        return model_sha256
    reported = info.extra.get("model_identity")
    if reported is not None:
        blob = json.dumps(reported, sort_keys=True, separators=(",", ":"), default=str)
        return "served:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()
    return fingerprint(Path(info.model_path)).sha256


def weights_known(resolved: Mapping[str, Any]) -> bool:
    """Whether a deployment's weights are a local file evalkit hashed (not a served model it cannot see):
    only then may a stored engine description or memoised tokenization stand for the model."""
    return resolved.get("sha256") is not None


def key_parts_from_info(info: EngineInfo, variant: str | None, options: Any, model_sha256: str | None = None, replicate: int = 0) -> dict[str, Any]:
    """`key_parts_for` filled in from a loaded engine's description (`model_identity` when no hash is given)."""
    sha = model_identity(info, model_sha256)
    backend = info.extra.get("system_info") or info.extra.get("device")
    return key_parts_for(info.engine, sha, variant, options, info.engine_version, backend, replicate)


def entry_key(parts: Mapping[str, Any], kind: str, payload: Mapping[str, Any]) -> str:
    blob = json.dumps({"deployment": parts, "kind": kind, "request": payload}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Entry:
    value: Any
    # When the engine measured the stored result. Entries written before entries carried the time have
    # none: None there, and only there ("unknown"), never a made-up time.
    measured_at: str | None


class ResultCache:
    """One JSON file per key under `root/<2 hex>/<key>.json`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "results"

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def entry(self, key: str) -> Entry | None:
        """The stored entry, or None for a miss (absent, torn, corrupt or written for another key)."""
        try:
            entry = json.loads(self.path(key).read_bytes())
            if entry["key"] != key or entry["format"] != FORMAT:
                return None
            return Entry(entry["value"], entry.get("measured_at"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # ValueError: JSON and UTF-8 errors
            return None

    def get(self, key: str) -> Any | None:
        """The stored value, or None for a miss."""
        hit = self.entry(key)
        return hit.value if hit is not None else None

    def put(self, key: str, value: Any, measured_at: str | None = None) -> None:
        # The time sits beside the value (not in it): older readers of the same layout still read the value.
        entry = {"format": FORMAT, "key": key, "value": value} | ({"measured_at": measured_at} if measured_at else {})
        text = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
        atomic_write_text(self.path(key), text)  # temp + fsync + rename: never a half entry under the name


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


_PROVENANCE = {"cached", "measured_at"}  # kept in the entry's envelope, not in its value


def _stamped(res: Any) -> Any:
    """A fresh GenResult/TokenScores with its time of measurement (engines stamp them when made; one built
    with measured_at=None gets the time it reached the cache)."""
    return res if res.measured_at else dataclasses.replace(res, measured_at=utc_now())


def _gen_to_json(res: GenResult) -> dict[str, Any]:
    return {k: v for k, v in asdict(res).items() if k not in _PROVENANCE}


def _gen_from_json(hit: Entry, key: str) -> GenResult:
    names = {f.name for f in fields(GenResult)} - _PROVENANCE
    # measured_at passed explicitly: a result made here would otherwise be stamped "now" (its default)
    return GenResult(**{k: v for k, v in hit.value.items() if k in names} | {"key": key},
                     cached=True, measured_at=hit.measured_at)


def _scores_to_json(res: TokenScores) -> dict[str, Any]:
    return {"token_ids": list(res.token_ids), "logprobs": list(res.logprobs), "top": res.top}


def _scores_from_json(hit: Entry) -> TokenScores:
    d = hit.value
    top = [[(int(t), float(lp)) for t, lp in row] for row in d["top"]] if d["top"] is not None else None
    return TokenScores(token_ids=d["token_ids"], logprobs=d["logprobs"], top=top, cached=True, measured_at=hit.measured_at)


_REQUEST_FIELDS_IN_PROMPT = {"key", "prompt", "chat", "prompt_token_ids", "max_tokens"}


def _generate_payload(req: GenRequest, sampling: SamplingParams, prompt_ids: list[int]) -> dict[str, Any]:
    """What a generation depends on: the fed tokens, every sampling field, the effective max_tokens, and
    any other GenRequest field (e.g. a future ignore_eos) when it differs from its default."""
    payload: dict[str, Any] = {"prompt_token_ids": list(prompt_ids), **asdict(sampling)}
    payload["max_tokens"] = req.max_tokens or sampling.max_tokens
    for f in fields(req):
        if f.name not in _REQUEST_FIELDS_IN_PROMPT and getattr(req, f.name) != f.default:
            payload[f.name] = getattr(req, f.name)
    return payload


class CachedEngine(Engine):
    """An Engine whose results come from the cache when the same request was run before.

    Misses go to the inner engine in one batch and are stored with the time they were measured. Results
    served from the cache keep the timings recorded when they were computed and carry `cached = True` and
    that time; `cached_keys` lists the GenRequest keys of the last generate() call that were hits, and
    `last_call_provenance()` says the same for each result of the last score / next_token_logprobs /
    score_span call (whose plain-list results cannot carry it).
    """

    def __init__(
        self,
        inner: Engine,
        key_parts: Mapping[str, Any],
        enabled: bool = True,
        root: Path | None = None,
        tokenizer_parts: Mapping[str, Any] | None = None,
        measurements: bool = False,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.key_parts = dict(key_parts)
        self.enabled = enabled
        self.store = ResultCache(root)
        self.stats = CacheStats()
        self.cached_keys: set[str] = set()
        self._provenance: list[Provenance] = []
        # Tokenization is memoised only when told what the tokenizer depends on (`engine_identity`).
        self.tokenizer_parts = dict(tokenizer_parts) if tokenizer_parts is not None else None
        self.measurements = measurements  # whether whole measurements (the cost suite's) may be stored

    def __getattr__(self, attr: str) -> Any:
        # Engine-specific extras (e.g. llama.cpp's full_logprobs) pass through, uncached.
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def _key(self, kind: str, payload: Mapping[str, Any]) -> str:
        return entry_key(self.key_parts, kind, payload)

    # -- pass-through -------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        return self.inner.info()

    def _memo(self, kind: str, payload: Mapping[str, Any], compute: Callable[[], Any]) -> Any:
        if not self.enabled or self.tokenizer_parts is None:
            return compute()
        key = entry_key(self.tokenizer_parts, kind, payload)
        hit = self.store.get(key)
        if hit is not None:
            return hit
        value = compute()
        self.store.put(key, value)
        return value

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self._memo("tokenize", {"text": text, "add_bos": add_bos}, lambda: list(self.inner.tokenize(text, add_bos)))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._memo("detokenize", {"token_ids": list(token_ids)}, lambda: self.inner.detokenize(token_ids))

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        payload = {"prompt": request.prompt, "chat": request.chat}
        return self._memo("prompt_token_ids", payload, lambda: list(self.inner.prompt_token_ids(request)))

    # -- whole measurements (the cost suite) ------------------------------------------------------

    @property
    def keeps_measurements(self) -> bool:
        """Whether whole measurements are read from and written to the cache (`--no-cache`: neither, nor
        anything they name: side files, KLD stores)."""
        return self.enabled and self.measurements

    def measurement(self, kind: str, payload: Mapping[str, Any]) -> Any | None:
        """A stored measurement for this deployment (None: absent, or measurements not kept)."""
        if not self.keeps_measurements:
            return None
        return self.store.get(self._key(kind, payload))

    def store_measurement(self, kind: str, payload: Mapping[str, Any], value: Any) -> None:
        if self.keeps_measurements:
            self.store.put(self._key(kind, payload), value)

    def close(self) -> None:
        self.inner.close()

    # -- cached calls -------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        self.cached_keys = set()
        if not self.enabled:
            yield from self.inner.generate(requests, sampling)
            return
        misses: list[GenRequest] = []
        keys: dict[str, str] = {}
        for req in requests:
            payload = _generate_payload(req, sampling, self.prompt_token_ids(req))
            key = self._key("generate", payload)
            hit = self.store.entry(key)
            if hit is None:
                keys[req.key] = key
                misses.append(req)
                continue
            self.stats.hits += 1
            self.cached_keys.add(req.key)
            yield _gen_from_json(hit, req.key)
        if not misses:
            return
        self.stats.misses += len(misses)
        for res in self.inner.generate(misses, sampling):
            res = _stamped(res)
            self.store.put(keys[res.key], _gen_to_json(res), res.measured_at)
            yield res

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        if not self.enabled:
            return self.inner.score(sequences, top_k)
        keys = [self._key("score", {"token_ids": list(s), "top_k": top_k}) for s in sequences]
        out: list[TokenScores | None] = []
        for key in keys:
            hit = self.store.entry(key)
            out.append(_scores_from_json(hit) if hit is not None else None)
        todo = [i for i, r in enumerate(out) if r is None]
        self.stats.hits += len(out) - len(todo)
        self.stats.misses += len(todo)
        if todo:
            for i, res in zip(todo, self.inner.score([sequences[i] for i in todo], top_k)):
                res = _stamped(res)
                self.store.put(keys[i], _scores_to_json(res), res.measured_at)
                out[i] = res
        results = [r for r in out if r is not None]
        self._provenance = [Provenance(r.cached, r.measured_at) for r in results]
        return results

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        if not self.enabled:
            return self.inner.next_token_logprobs(prompts, candidates)
        keys = [self._key("next_token_logprobs", {"token_ids": list(p), "candidates": list(candidates)}) for p in prompts]
        hits = [self.store.entry(k) for k in keys]
        out: list[list[float] | None] = [h.value if h is not None else None for h in hits]
        prov = [Provenance(True, h.measured_at) if h is not None else None for h in hits]
        todo = [i for i, r in enumerate(out) if r is None]
        self.stats.hits += len(out) - len(todo)
        self.stats.misses += len(todo)
        if todo:
            results = self.inner.next_token_logprobs([prompts[i] for i in todo], candidates)
            now = utc_now()  # the engine's call has just returned them
            for i, res in zip(todo, results):
                self.store.put(keys[i], res, now)
                out[i], prov[i] = res, Provenance(False, now)
        self._provenance = [p for p in prov if p is not None]
        return [r for r in out if r is not None]  # every slot is filled by now

    def score_span(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
        """`Engine.score_span` (the perplexity suite's per-chunk scoring), cached; a miss runs the inner
        engine's own score_span, so cached and uncached runs give the same numbers."""
        if not self.enabled:
            return self.inner.score_span(token_ids, first, top_k)
        key = self._key("score_span", {"token_ids": list(token_ids), "first": first, "top_k": top_k})
        hit = self.store.entry(key)
        if hit is not None:
            self.stats.hits += 1
            self._provenance = [Provenance(True, hit.measured_at)]
            return hit.value[0], hit.value[1]
        self.stats.misses += 1
        nll, top = self.inner.score_span(token_ids, first, top_k)
        now = utc_now()
        self.store.put(key, [nll, top], now)
        self._provenance = [Provenance(False, now)]
        return nll, top

    def token_distributions(self, token_ids: Sequence[int], first: int) -> Iterator[tuple[int, Any]]:
        # Full-vocabulary rows are megabytes per token: never cached, always computed.
        return self.inner.token_distributions(token_ids, first)

    def uncached(self) -> Engine:
        return self.inner.uncached()

    def last_call_provenance(self) -> list[Provenance] | None:
        return list(self._provenance) if self.enabled else None

    def run_stats(self) -> dict[str, Any]:
        return {**self.inner.run_stats(), "cache_hits": self.stats.hits, "cache_misses": self.stats.misses}


def uncached(engine: Engine) -> Engine:
    """The engine underneath any cache wrapper (`Engine.uncached`): for work whose timings are the point
    (a `LazyEngine` underneath loads the real engine on its first model call)."""
    return engine.uncached()


class LazyEngine(Engine):
    """An engine that loads only when a model call needs it.

    Until then `info()` is the stored description (`extra["info_from_cache"]` is True: its `load_s` is from
    the run that stored it) and tokenization goes to a tokenizer-only stand-in, itself loaded on first use.
    Once the real engine is loaded, every call goes to it. `loads` counts real-engine loads.
    """

    def __init__(
        self,
        name: str,
        load: Callable[[], Engine],
        info: EngineInfo,
        tokenizer: Callable[[], Engine] | None = None,
        engine: Engine | None = None,
        on_load: Callable[[Engine], None] | None = None,
    ) -> None:
        self.name = name
        self._load = load
        self._info = info
        self._tokenizer_factory = tokenizer
        self._tok: Engine | None = None
        self.engine = engine
        self.on_load = on_load
        self.loads = 0

    @property
    def is_loaded(self) -> bool:
        return self.engine is not None

    def real(self) -> Engine:
        if self.engine is None:
            if self._tok is not None:  # the stand-in's memory goes before the model's arrives
                self._tok.close()
                self._tok = None
            self.engine = self._load()
            self.loads += 1
            if self.on_load is not None:
                self.on_load(self.engine)
        return self.engine

    def _tokenizer(self) -> Engine:
        if self.engine is not None:
            return self.engine
        if self._tokenizer_factory is None:
            return self.real()
        if self._tok is None:
            self._tok = self._tokenizer_factory()
        return self._tok

    def __getattr__(self, attr: str) -> Any:
        # Engine-specific extras (e.g. llama.cpp's full_logprobs) need the real engine.
        if attr.startswith("__") or attr in {"engine", "_load", "_tok", "_tokenizer_factory", "_info", "on_load"}:
            raise AttributeError(attr)
        return getattr(self.real(), attr)

    def info(self) -> EngineInfo:
        return self.engine.info() if self.engine is not None else self._info

    def prepare_for_timing(self) -> bool:
        return self.engine is None or self.engine.prepare_for_timing()

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self._tokenizer().tokenize(text, add_bos)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer().detokenize(token_ids)

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        return self._tokenizer().prompt_token_ids(request)

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        return self.real().generate(requests, sampling)

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        return self.real().score(sequences, top_k)

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        return self.real().next_token_logprobs(prompts, candidates)

    def score_span(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[list[float], list[list[list[float]]]]:
        return self.real().score_span(token_ids, first, top_k)

    def score_span_arrays(self, token_ids: Sequence[int], first: int, top_k: int) -> tuple[Any, Any, Any]:
        return self.real().score_span_arrays(token_ids, first, top_k)

    def token_distributions(self, token_ids: Sequence[int], first: int) -> Iterator[tuple[int, Any]]:
        return self.real().token_distributions(token_ids, first)

    def run_stats(self) -> dict[str, Any]:
        return {**(self.engine.run_stats() if self.engine is not None else {}), "engine_loaded": self.is_loaded}

    def close(self) -> None:
        if self._tok is not None:
            self._tok.close()
            self._tok = None
        if self.engine is not None:
            self.engine.close()


def engine_identity(engine: str, resolved: Mapping[str, Any], options: Any) -> dict[str, Any]:
    """What a deployment's engine description and tokenization depend on, known without loading anything:
    model content and path, variant, engine package version, every option, and this host."""
    from evalkit.engines.tokenizer import engine_package_version

    values = options.model_dump(mode="json") if hasattr(options, "model_dump") else dict(options or {})
    return {
        "format": FORMAT,
        "engine": engine,
        "engine_package_version": engine_package_version(engine),
        "model_sha256": resolved.get("sha256"),
        "model_path": str(resolved.get("path")),
        "variant": resolved.get("variant"),
        "options": values,
        "host": platform.node(),
        "machine": platform.machine(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def info_to_json(info: EngineInfo) -> dict[str, Any]:
    """An engine description as the cache stores it (JSON; the time it was stored, not where it came from)."""
    out = asdict(info)
    out["extra"] = {k: v for k, v in out["extra"].items() if k not in {"info_from_cache", "info_stored_at"}}
    out["extra"]["info_stored_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return json.loads(json.dumps(out, default=str))  # whatever an engine puts in `extra`, as JSON


def info_from_json(d: Mapping[str, Any]) -> EngineInfo:
    """A stored engine description, marked as read from the cache."""
    names = {f.name for f in fields(EngineInfo)}
    info = EngineInfo(**{k: v for k, v in d.items() if k in names})
    info.extra["info_from_cache"] = True  # load_s is the stored run's start-up, not this run's
    return info


def open_engine(
    deployment: Any,
    resolved: Mapping[str, Any],
    deployment_name: str,
    root: Path | None = None,
    replicate: int | None = None,
    extra_parts: Mapping[str, Any] | None = None,
) -> CachedEngine:
    """The worker's cached engine, loading nothing while everything it is asked for is cached.

    First time for this deployment identity: the engine loads now and its description is stored. Later:
    the stored description keys the cache, a tokenizer stand-in serves tokenization misses, and the engine
    loads on the first result miss. `replicate` (default: resolved["replicate"]) keys the noise-floor rerun;
    `extra_parts` joins every result key (the judge's identity: its prompt templates and rubrics).
    """
    store = ResultCache(root)
    identity = engine_identity(deployment.engine, resolved, deployment.options)
    info_key = entry_key(identity, "engine_info", {})
    rep = int(resolved.get("replicate", 0)) if replicate is None else replicate
    path = None if resolved.get("path") is None else str(resolved["path"])  # None: a served model, weights not named
    known = weights_known(resolved)

    def load() -> Engine:
        return load_engine(deployment.engine, path, deployment.options, deployment_name)

    def tokenizer() -> Engine:
        from evalkit.engines.tokenizer import load_tokenizer

        return load_tokenizer(deployment.engine, path, deployment.options)

    def parts_of(info: EngineInfo) -> dict[str, Any]:
        parts = key_parts_from_info(info, resolved.get("variant"), deployment.options, resolved.get("sha256"), rep)
        return parts | ({"extra": dict(extra_parts)} if extra_parts else {})

    # A served model's weights can change behind the same address: describe it from what answers now.
    stored = store.get(info_key) if known else None
    info = None
    if stored is not None:
        try:
            info = info_from_json(stored)
        except TypeError:  # a description written by another EngineInfo layout: a miss
            info = None
    if info is None:
        real = load()
        info = real.info()
        store.put(info_key, info_to_json(info))
        lazy = LazyEngine(deployment.engine, load, info, tokenizer, engine=real)
        lazy.loads = 1
    else:
        lazy = LazyEngine(deployment.engine, load, info, tokenizer)
    cached = CachedEngine(lazy, parts_of(info), root=root, tokenizer_parts=identity if known else None, measurements=True)

    def on_load(real: Engine) -> None:
        fresh = real.info()
        store.put(info_key, info_to_json(fresh))
        parts = parts_of(fresh)
        if parts != cached.key_parts:
            print(
                f"evalkit: warning: {deployment_name}: the stored engine description did not match the loaded "
                "engine; it is refreshed and further results are keyed by the loaded engine",
                file=sys.stderr,
            )
            cached.key_parts = parts

    lazy.on_load = on_load
    return cached


def wrap_engine(
    engine: Engine,
    deployment: Any,
    resolved: Mapping[str, Any],
    enabled: bool = True,
    replicate: int | None = None,
    root: Path | None = None,
) -> CachedEngine:
    """The worker's hook: `deployment` is the config's deployment, `resolved` its manifest entry
    (sha256, variant, and `replicate` for the noise-floor rerun, whose results must not be the first run's)."""
    rep = int(resolved.get("replicate", 0)) if replicate is None else replicate
    parts = key_parts_from_info(engine.info(), resolved.get("variant"), deployment.options, resolved.get("sha256"), rep)
    return CachedEngine(engine, parts, enabled=enabled, root=root)


# -- whole measurements with a side file (perplexity's chunks) -----------------------------------------------

Measured = tuple[dict[str, Any], "SideFile", dict[str, Any]]  # record scalars, side file, provenance


def keeps_measurements(engine: Engine) -> bool:
    """Whether this engine's results go through the result cache (not under `--no-cache`)."""
    return bool(getattr(engine, "keeps_measurements", False))


def uncached_engine(engine: Engine) -> Engine:
    """The engine underneath any result cache (`Engine.uncached`)."""
    return engine.uncached() if hasattr(engine, "uncached") else engine


def cached_measurement(engine: Engine, kind: str, payload: dict[str, Any], compute: Callable[[], tuple[dict[str, Any], "SideFile"]],
                       ok: Callable[[dict[str, Any]], bool] = lambda hit: True) -> Measured:
    """One measurement through the engine-result cache (when the engine has one): the entry holds the record's
    scalars and the side file's hash; the side file itself is kept by hash under the cache's `arrays/`
    (evalkit.sidefiles), so a re-run copies bytes and parses no array. `ok` vets a hit further."""
    from evalkit.sidefiles import SideFile, side_path, write_side_file

    if not keeps_measurements(engine):
        scalars, side = compute()
        return scalars, side, {"cached": False, "measured_at": utc_now()}
    hit = engine.measurement(kind, payload)
    if isinstance(hit, dict) and isinstance(hit.get("arrays_sha256"), str) and ok(hit):
        sha = hit["arrays_sha256"]
        blob = side_path(cache_dir(), sha)
        try:
            data = blob.read_bytes()
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() == sha:
            scalars = {k: v for k, v in hit.items() if k not in ("arrays_sha256", "measured_at")}
            stamp = hit.get("measured_at")  # None: a stored measurement from before it kept the time
            return scalars, SideFile(sha, data), {"cached": True, "measured_at": stamp}
    scalars, side = compute()
    now = utc_now()
    try:
        write_side_file(cache_dir(), side)
        engine.store_measurement(kind, payload, {**scalars, "arrays_sha256": side.sha256, "measured_at": now})
    except OSError as e:  # a full cache disk costs the cache entry, not the run
        print(f"evalkit: warning: result cache not written ({e.strerror})", file=sys.stderr, flush=True)
    return scalars, side, {"cached": False, "measured_at": now}
