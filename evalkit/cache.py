"""The engine-result cache: every engine call's result on disk, keyed by everything that can change it.

A key is the sha256 of: the model file's content hash (not its name), the variant, the engine's name,
version and backend, the engine options that change numerics (an allow-list per engine, below), the exact
prompt token ids, the sampling parameters and the call kind (generate / score(top_k) /
next_token_logprobs(candidates)). One JSON file per entry, sharded by the key's first two hex digits,
written atomically (temp file + fsync + rename): a process killed mid-write leaves at most a stray temp
file, which is never read. An unreadable or mismatching entry is a miss and is overwritten.

Timing-sensitive work (the cost suite) must not be served from here: it calls `uncached(engine)`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores
from evalkit.models import cache_dir, fingerprint
from evalkit.store import atomic_write_text

FORMAT = 1  # bump when the entry layout or key recipe changes: old entries then simply miss

# Engine options that can change a result, per engine. Everything else (threads, memory shares,
# templates: the template's effect is already in the prompt token ids) is left out so it can change
# freely without losing the cache.
NUMERICS_OPTIONS: dict[str, tuple[str, ...]] = {
    "llamacpp": (
        # n_ctx does not change the numbers of a request that fits, but it bounds how many tokens
        # generate() may produce (room = n_ctx - prompt) and whether scoring fails; kept for safety.
        "n_ctx",
        "n_batch",  # also used as n_ubatch: the matmul batch shape, can change the last bits
        "n_gpu_layers",  # GPU kernels round differently from CPU ones
        "tensor_split",  # which device computes which layer
        # n_threads is left out: ggml's CPU matmuls give each output to one thread (no split-K sums).
    ),
    "vllm": (
        "dtype",
        "quantization",
        "kv_cache_dtype",
        "tensor_parallel_size",  # all-reduce order
        "max_model_len",  # same reasoning as llama.cpp's n_ctx
        "enforce_eager",  # CUDA graphs vs eager kernels
        "seed",  # the engine-level seed feeds sampling at temperature > 0
        # max_num_seqs / gpu_memory_utilization change batch composition; vLLM's results already depend
        # on which requests share a batch, which no key can capture: a hit is one valid draw.
    ),
}


def numerics_options(engine: str, options: Any) -> dict[str, Any]:
    """The allow-listed engine options (from a pydantic options model or a dict)."""
    values = options.model_dump() if hasattr(options, "model_dump") else dict(options or {})
    return {k: values.get(k) for k in NUMERICS_OPTIONS.get(engine, ()) if k in values}


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


def key_parts_from_info(info: EngineInfo, variant: str | None, options: Any, model_sha256: str | None = None, replicate: int = 0) -> dict[str, Any]:
    """`key_parts_for` filled in from a loaded engine's description (hashes the model file if not given)."""
    sha = model_sha256 or fingerprint(Path(info.model_path)).sha256
    backend = info.extra.get("system_info") or info.extra.get("device")
    return key_parts_for(info.engine, sha, variant, options, info.engine_version, backend, replicate)


def entry_key(parts: Mapping[str, Any], kind: str, payload: Mapping[str, Any]) -> str:
    blob = json.dumps({"deployment": parts, "kind": kind, "request": payload}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResultCache:
    """One JSON file per key under `root/<2 hex>/<key>.json`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "results"

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        """The stored value, or None for a miss (absent, torn, corrupt or written for another key)."""
        try:
            entry = json.loads(self.path(key).read_bytes())
            if entry["key"] != key or entry["format"] != FORMAT:
                return None
            return entry["value"]
        except (OSError, ValueError, KeyError, TypeError):  # ValueError covers JSON and UTF-8 errors
            return None

    def put(self, key: str, value: Any) -> None:
        text = json.dumps({"format": FORMAT, "key": key, "value": value}, ensure_ascii=False, separators=(",", ":"))
        atomic_write_text(self.path(key), text)  # temp + fsync + rename: never a half entry under the name


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


def _mark_cached(result: Any) -> Any:
    """Tag a result served from the cache: `result.cached` is True (absent/False for fresh results)."""
    if "cached" in {f.name for f in fields(result)}:  # once GenResult/TokenScores carry the field
        return dataclasses.replace(result, cached=True)
    object.__setattr__(result, "cached", True)  # frozen dataclass without the field yet: attribute tag
    return result


def _gen_to_json(res: GenResult) -> dict[str, Any]:
    out = asdict(res)
    out.pop("cached", None)
    return out


def _gen_from_json(d: dict[str, Any], key: str) -> GenResult:
    names = {f.name for f in fields(GenResult)} - {"cached"}
    return GenResult(**{k: v for k, v in d.items() if k in names} | {"key": key})


def _scores_to_json(res: TokenScores) -> dict[str, Any]:
    return {"token_ids": list(res.token_ids), "logprobs": list(res.logprobs), "top": res.top}


def _scores_from_json(d: dict[str, Any]) -> TokenScores:
    top = [[(int(t), float(lp)) for t, lp in row] for row in d["top"]] if d["top"] is not None else None
    return TokenScores(token_ids=d["token_ids"], logprobs=d["logprobs"], top=top)


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

    Misses go to the inner engine in one batch and are stored. Results served from the cache keep the
    timings recorded when they were computed and carry `cached = True` (see `_mark_cached`);
    `cached_keys` lists the GenRequest keys of the last generate() call that were hits.
    """

    def __init__(self, inner: Engine, key_parts: Mapping[str, Any], enabled: bool = True, root: Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.key_parts = dict(key_parts)
        self.enabled = enabled
        self.store = ResultCache(root)
        self.stats = CacheStats()
        self.cached_keys: set[str] = set()

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

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return self.inner.tokenize(text, add_bos)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.inner.detokenize(token_ids)

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        return self.inner.prompt_token_ids(request)

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
            payload = _generate_payload(req, sampling, self.inner.prompt_token_ids(req))
            key = self._key("generate", payload)
            hit = self.store.get(key)
            if hit is None:
                keys[req.key] = key
                misses.append(req)
                continue
            self.stats.hits += 1
            self.cached_keys.add(req.key)
            yield _mark_cached(_gen_from_json(hit, req.key))
        if not misses:
            return
        self.stats.misses += len(misses)
        for res in self.inner.generate(misses, sampling):
            self.store.put(keys[res.key], _gen_to_json(res))
            yield res

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        if not self.enabled:
            return self.inner.score(sequences, top_k)
        keys = [self._key("score", {"token_ids": list(s), "top_k": top_k}) for s in sequences]
        out: list[TokenScores | None] = []
        for key in keys:
            hit = self.store.get(key)
            out.append(_mark_cached(_scores_from_json(hit)) if hit is not None else None)
        todo = [i for i, r in enumerate(out) if r is None]
        self.stats.hits += len(out) - len(todo)
        self.stats.misses += len(todo)
        if todo:
            for i, res in zip(todo, self.inner.score([sequences[i] for i in todo], top_k)):
                self.store.put(keys[i], _scores_to_json(res))
                out[i] = res
        return [r for r in out if r is not None]

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        if not self.enabled:
            return self.inner.next_token_logprobs(prompts, candidates)
        keys = [self._key("next_token_logprobs", {"token_ids": list(p), "candidates": list(candidates)}) for p in prompts]
        out: list[list[float] | None] = [self.store.get(k) for k in keys]
        todo = [i for i, r in enumerate(out) if r is None]
        self.stats.hits += len(out) - len(todo)
        self.stats.misses += len(todo)
        if todo:
            for i, res in zip(todo, self.inner.next_token_logprobs([prompts[i] for i in todo], candidates)):
                self.store.put(keys[i], res)
                out[i] = res
        return [r for r in out if r is not None]  # every slot is filled by now



def uncached(engine: Engine) -> Engine:
    """The engine underneath any cache wrapper: for work whose timings are the point."""
    while isinstance(engine, CachedEngine):
        engine = engine.inner
    return engine


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
