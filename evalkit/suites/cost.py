"""The cost suite: throughput, time to first token, latency and peak memory at each concurrency level.

For each level c and repeat r, c requests arrive together (one generate() call), each with a synthetic
prompt of exactly `prompt_tokens` tokens and asking for `output_tokens` tokens. Prompts are seeded
English words led by a word that differs from the previous request's, so no prefix cache (llama.cpp's
reuse of the previous prompt, vLLM's block hashes) flatters a request. llama.cpp in-process serves the
requests queued in one context: that is measured as it is. Each level's batch shape is warmed up first, unrecorded,
unless the engine says nothing is left to warm (`Engine.prepare_for_timing`: llama.cpp on the CPU once it has computed).
Requests are never served from the engine-result cache: timings are the point.

Re-runs: a whole (level, repeat) measurement is stored in the result cache, keyed by the deployment's
cache key parts (model content, variant, engine version and backend, numerics options, replicate) plus
these cost settings, the sampling parameters and the prompt recipe. A cached re-run reuses it rather than
loading the engine just to time it again (vLLM's start-up alone is most of a minute), and says so: the
record carries `"cached": true` and `measured_at`, the UTC time it was measured (fresh records:
`"cached": false`). `--no-cache` re-measures everything, and the noise-floor rerun (replicate 1) is keyed
apart, so it is always measured. Only the worker's engine stores measurements (`open_engine`); a plain
CachedEngine never does.
"""
from __future__ import annotations

import json
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import psutil
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit.engines.base import Engine, GenRequest, SamplingParams
from evalkit.config import PositiveInt
from evalkit.metrics.declarations import MetricSpec
from evalkit.records import Generation, Record, dump_record, nested_generation, parse_record, typed, utc_now
from evalkit.store import ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords
from evalkit.suites.spec import SuiteSpec, ViewerSpec


# The field comparison's speed protocol (../shared/MOTIVATION.md): 128-token prompts, 256 generated tokens,
# temperature 0.7, 1/4/8/16 concurrent requests, median of three runs. `cost: {preset: field}`.
COST_PRESETS: dict[str, dict[str, Any]] = {
    "field": {"concurrency": [1, 4, 8, 16], "prompt_tokens": 128, "output_tokens": 256, "repeats": 3, "temperature": 0.7},
}


class CostSettings(BaseModel):
    """`suites.cost`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["field"] | None = None  # fills every setting left out from COST_PRESETS
    concurrency: list[PositiveInt] = Field(default=[1, 4, 8, 16], min_length=1)
    prompt_tokens: PositiveInt = 128
    output_tokens: PositiveInt = 256
    repeats: PositiveInt = 3
    temperature: float | None = Field(default=None, ge=0.0)  # None: the run's sampling temperature

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in COST_PRESETS:
            return {**COST_PRESETS[data["preset"]], **data}
        return data


class CostRequest(BaseModel):
    """One request of a level: its prompt and what it generated (version 3: `generation`; before, flat and
    without the text, with `output_tokens` its token count)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    prompt_tokens: int
    prompt_token_ids: list[int]
    generation: Generation


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

    @classmethod
    def from_v2(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return {**raw, "requests": [nested_generation(r, drop=("output_tokens",)) for r in raw.get("requests", [])]}


METRICS = (
    MetricSpec("cost", "tokens_per_s", "tokens/s", "higher", "continuous", "num", "none", "total output tokens / wall time",
               role="tokens_per_s"),  # roles: what the decision reads at the workload's concurrency
    MetricSpec("cost", "per_request_tokens_per_s", "tokens/s", "higher", "continuous", "num", "none",
               role="per_request_tokens_per_s"),
    MetricSpec("cost", "latency_median_s", "s", "lower", "continuous", "s", "none"),
    MetricSpec("cost", "latency_p90_s", "s", "lower", "continuous", "s", "none"),
    MetricSpec("cost", "ttft_median_s", "s", "lower", "continuous", "ms", "none", role="ttft_s"),
    MetricSpec("cost", "ttft_p90_s", "s", "lower", "continuous", "ms", "none"),
    MetricSpec("cost", "itl_median_s", "s", "lower", "continuous", "ms", "none", "inter-token latency: (last - first token time) / (tokens - 1), per request"),
    MetricSpec("cost", "itl_p90_s", "s", "lower", "continuous", "ms", "none"),
    MetricSpec("cost", "server_peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "high-water RSS of the server evalkit started"),
    MetricSpec("cost", "output_tokens_mean", "tokens", "none", "continuous", "num", "none"),
    MetricSpec("cost", "peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "process tree RSS sampled during the level"),
    MetricSpec("cost", "worker_peak_rss_mb", "MiB", "lower", "continuous", "mb", "none", "process tree high-water RSS since the worker started"),
    MetricSpec("cost", "peak_gpu_mem_mb", "MiB", "lower", "continuous", "mb", "none"),
    MetricSpec("cost", "power_w", "W", "lower", "continuous", "num", "none"),
    MetricSpec("cost", "decode_tokens_per_s", "tokens/s", "higher", "continuous", "num", "none",
       "per request, after its first token: (output tokens - 1) / (latency - time to first token), median"),
    MetricSpec("cost", "bandwidth_bound_share", "ratio", "higher", "continuous", "num", "none",
       "decode tokens/s per request / (memory bandwidth / weight bytes read per token)"),
    MetricSpec("cost", "memory_bandwidth_gb_s", "GB/s", "none", "continuous", "num", "none",
       "GPU: the table's datasheet figure (evalkit/gpus.py); CPU: measured (numpy copy, bytes read + written)"),
    MetricSpec("cost", "weights_gb", "GB", "none", "continuous", "num", "none", "weight bytes read per decoded token"),
    MetricSpec("cost", "max_temp_c", "°C", "none", "continuous", "num", "none"),
    MetricSpec("cost", "startup_s", "s", "lower", "continuous", "s", "none", "engine load time"),
)

WORDS = (
    "river mountain garden window silver market winter candle harbor meadow forest bridge lantern "
    "orchard valley thunder pepper castle island marble feather compass violet canyon ladder pocket "
    "saddle timber copper basket falcon glacier hammer jungle kettle lemon mirror needle oyster pillow "
    "quartz rabbit shadow tunnel umbrella velvet walnut yellow zephyr anchor blossom cobalt desert "
    "ember fabric goblet horizon ivory jacket kernel lagoon meteor nectar onion parrot quiver ribbon "
    "summit tulip urchin vessel wizard"
).split()
PROMPT_RECIPE = (
    "random.Random('evalkit-cost:<g>') English words, led by WORDS[g % {n}] (g = the request's index over "
    "all levels and repeats), tokenized with BOS and cut to prompt_tokens tokens; sent as prompt_token_ids"
).format(n=len(WORDS))
SAMPLE_INTERVAL_S = 0.05
WARMUP_TOKENS = 16


def synthetic_prompt(engine: Engine, index: int, n_tokens: int) -> list[int]:
    """Exactly `n_tokens` token ids (BOS included), deterministic in `index`."""
    rng = random.Random(f"evalkit-cost:{index}")
    text = WORDS[index % len(WORDS)].capitalize()
    ids = engine.tokenize(text, add_bos=True)
    while len(ids) < n_tokens:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(n_tokens))
        ids = engine.tokenize(text, add_bos=True)
    return ids[:n_tokens]


def _rss_of(p: psutil.Process) -> int:
    """A process's current RSS; 0 once it has exited."""
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def _high_water_of(p: psutil.Process) -> int:
    """A process's VmHWM (Linux's /proc), else its current RSS."""
    try:
        with open(f"/proc/{p.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return _rss_of(p)


class ResourceSampler:
    """Samples RSS of this process tree (and GPU memory, power, temperature via NVML) in a thread."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._proc = psutil.Process()
        self.peak_rss = 0
        self._gpus = _nvml_handles()
        self._gpu: list[dict[str, Any]] = [{"peak_mem": 0, "power": [], "temp": 0} for _ in self._gpus]

    def _tree(self) -> list[psutil.Process]:
        # vLLM runs its engine core in child processes; shared pages are counted once per process.
        return [self._proc, *self._proc.children(recursive=True)]

    def _rss(self) -> int:
        return sum(_rss_of(p) for p in self._tree())

    def high_water(self) -> int:
        """The process tree's high-water RSS: each living process's VmHWM (its own peak since it started,
        kept by the kernel) summed. Unlike the sampled peak it sees transients between samples and before
        this level (model load, log-softmax arrays of a perplexity chunk); the memory ledger is checked
        against it. Outside Linux: the current RSS."""
        return sum(_high_water_of(p) for p in self._tree())

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self._rss())
        if self._gpus:
            import pynvml

            for h, acc in zip(self._gpus, self._gpu):
                acc["peak_mem"] = max(acc["peak_mem"], pynvml.nvmlDeviceGetMemoryInfo(h).used)
                acc["power"].append(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)  # milliwatts
                acc["temp"] = max(acc["temp"], pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "ResourceSampler":
        self.baseline_rss = self._rss()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def gpu_summary(self) -> list[dict[str, Any]] | None:
        if not self._gpus:
            return None
        return [
            {
                "index": i,
                "peak_mem_mb": acc["peak_mem"] / 2**20,
                "mean_power_w": statistics.fmean(acc["power"]) if acc["power"] else None,
                "max_power_w": max(acc["power"]) if acc["power"] else None,
                "max_temp_c": acc["temp"],
            }
            for i, acc in enumerate(self._gpu)
        ]


def _nvml_handles() -> list[Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no pynvml / driver / GPU: memory is process RSS only
        return []


def memory_bandwidth(info: Any, memo: Path | None = None) -> dict[str, Any]:
    """What bounds decode on the device the engine computes on: bytes/s and where the figure comes from, with
    the weight bytes read per decoded token (the engine's own count, `weights_bytes` in its description).

    GPU (an engine that reports a CUDA device or llama.cpp offload): the GPU table's datasheet bandwidth for
    the NVML name. CPU: measured here, a numpy copy of 256 MB (best of 3, bytes read + written), once per run and
    machine: `memo` keeps it for the run's other deployments (the probe is a process start and 512 MB of pages)."""
    extra = info.extra or {}
    out: dict[str, Any] = {"weights_bytes": extra.get("weights_bytes")}
    on_gpu = "cuda" in str(extra.get("device", "")) or "GPU" in str(extra.get("offload", ""))
    if on_gpu:
        from evalkit.gpus import lookup

        names = _gpu_names()
        gpu = lookup(names[0]) if names else None
        if gpu is not None and gpu.bandwidth_gb_s:
            return out | {"bytes_per_s": gpu.bandwidth_gb_s * 1e9, "device": gpu.name,
                          "source": f"datasheet: {gpu.name}, {gpu.bandwidth_gb_s:g} GB/s (evalkit/gpus.py)"}
        return out | {"bytes_per_s": None, "device": names[0] if names else "GPU", "source": "GPU not in evalkit/gpus.py"}
    copied_bytes, best = _cpu_copy_seconds(memo)
    return out | {"bytes_per_s": 2 * copied_bytes / best, "device": "CPU",
                  "source": f"measured: numpy copy of {copied_bytes / 1e6:.0f} MB, read + write, best of 3"}


# Run in a child process: the two 268 MB buffers would otherwise become the worker's high-water RSS, which is
# the memory measurement the ledger's prediction is held against (test_ledger_measured).
_COPY_PROBE = """
import time, numpy as np
src = np.ones(2**28 // 8, dtype=np.float64); dst = np.empty_like(src)
def once():
    t = time.perf_counter(); np.copyto(dst, src); return time.perf_counter() - t
print(src.nbytes, min(once() for _ in range(3)))
"""


def _cpu_copy_seconds(memo: Path | None = None) -> tuple[int, float]:
    """(bytes copied, best seconds of 3) for a numpy copy larger than any CPU cache, measured in a child; read
    from `memo` when an earlier deployment of the run measured it on this machine (a node that cannot write
    there simply measures)."""
    if memo is not None:
        try:
            kept = json.loads(memo.read_text(encoding="utf-8"))
            return int(kept["bytes"]), float(kept["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    proc = subprocess.run([sys.executable, "-c", _COPY_PROBE], capture_output=True, text=True, check=True, timeout=120)
    nbytes, seconds = proc.stdout.split()
    if memo is not None:
        from evalkit.store import atomic_write_text

        try:
            atomic_write_text(memo, json.dumps({"bytes": int(nbytes), "seconds": float(seconds)}) + "\n")
        except OSError:
            pass
    return int(nbytes), float(seconds)


def bandwidth_memo(run_dir: Path | None) -> Path | None:
    """Where a run keeps this machine's measured CPU memory bandwidth (None: a suite run outside a run)."""
    return run_dir / "logs" / f"cpu-bandwidth.{platform.node()}.json" if run_dir is not None else None


def _gpu_names() -> list[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no pynvml / driver
        return []


def _timings(request: dict[str, Any]) -> dict[str, Any]:
    gen = request.get("generation") or request  # a version-2 request: flat (still read where one is handed in raw)
    tokens = len(gen["output_token_ids"]) if "output_token_ids" in gen else request["output_tokens"]
    return {"ttft_s": gen.get("ttft_s"), "total_s": gen["total_s"], "output_tokens": tokens}


def level_metrics(record: dict[str, Any]) -> dict[str, float]:
    """One (level, repeat)'s figures from its raw per-request timings (a records line: each request's `generation`)."""
    reqs = [_timings(r) for r in record["requests"]]
    ttfts = [r["ttft_s"] for r in reqs if r.get("ttft_s") is not None]
    lat = [r["total_s"] for r in reqs]
    out_tokens = [r["output_tokens"] for r in reqs]
    m = {
        "tokens_per_s": sum(out_tokens) / record["wall_s"],
        "per_request_tokens_per_s": float(np.median([n / t for n, t in zip(out_tokens, lat) if t > 0])),
        "latency_median_s": float(np.median(lat)),
        "latency_p90_s": float(np.percentile(lat, 90)),
        "output_tokens_mean": float(np.mean(out_tokens)),
        "peak_rss_mb": record["peak_rss_mb"],
    }
    if record.get("worker_peak_rss_mb") is not None:  # absent from records written before it was recorded
        m["worker_peak_rss_mb"] = record["worker_peak_rss_mb"]
    if record.get("server_peak_rss_mb") is not None:  # a server evalkit started (its own process tree)
        m["server_peak_rss_mb"] = record["server_peak_rss_mb"]
    if ttfts:
        m |= {"ttft_median_s": float(np.median(ttfts)), "ttft_p90_s": float(np.percentile(ttfts, 90))}
    # Inter-token latency per request: the time between its first and last token over the gaps between them
    # (vLLM's benchmark calls it TPOT), the same from in-process timings and from a server's stream.
    itls = [(r["total_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in reqs
            if r.get("ttft_s") is not None and r["output_tokens"] > 1]
    if itls:
        m |= {"itl_median_s": float(np.median(itls)), "itl_p90_s": float(np.percentile(itls, 90))}
    decode = [(r["output_tokens"] - 1) / (r["total_s"] - r["ttft_s"]) for r in reqs
              if r.get("ttft_s") is not None and r["output_tokens"] > 1 and r["total_s"] > r["ttft_s"]]
    if decode:
        m["decode_tokens_per_s"] = float(np.median(decode))
        bw = record.get("bandwidth") or {}
        if bw.get("bytes_per_s") and bw.get("weights_bytes"):
            # Each decode step reads every weight once (KV reads are small at these lengths): the bound is bw / bytes.
            m["bandwidth_bound_share"] = m["decode_tokens_per_s"] * bw["weights_bytes"] / bw["bytes_per_s"]
            m["memory_bandwidth_gb_s"] = bw["bytes_per_s"] / 1e9
            m["weights_gb"] = bw["weights_bytes"] / 1e9
    gpus = record.get("gpu")
    if gpus:
        m["peak_gpu_mem_mb"] = max(g["peak_mem_mb"] for g in gpus)
        powers = [g["mean_power_w"] for g in gpus if g["mean_power_w"] is not None]
        if powers:
            m["power_w"] = sum(powers)  # all GPUs together
        m["max_temp_c"] = float(max(g["max_temp_c"] for g in gpus))
    return m


def _server_peak_mb(engine: Engine) -> float | None:
    """High-water RSS of a server the engine started itself (served engines; None for the others)."""
    peak = getattr(engine, "server_peak_rss", None)  # only engines that start a server have it
    value = peak() if callable(peak) else None
    return value / 2**20 if value else None


class CostSuite(Suite["CostSettings"]):
    name = "cost"
    requires = frozenset({Capability.GENERATE, Capability.TOKENIZER})

    def items(self) -> list[Item]:
        out, first = [], 0
        for c in self.settings.concurrency:
            for r in range(1, self.settings.repeats + 1):
                out.append(Item(f"c{c}/r{r}", f"c{c}", {"concurrency": c, "repeat": r, "first_request": first}))
                first += c
        return out

    def _requests(self, engine: Engine, first: int, n: int, tag: str, max_tokens: int) -> list[GenRequest]:
        return [
            GenRequest(
                key=f"{tag}/q{i - first}",
                prompt="",
                chat=False,
                max_tokens=max_tokens,
                prompt_token_ids=tuple(synthetic_prompt(engine, i, self.settings.prompt_tokens)),
                ignore_eos=True,  # fixed lengths: generate past end-of-generation
            )
            for i in range(first, first + n)
        ]

    def _measurement_key(self, item: Item, sampling: SamplingParams) -> dict[str, Any]:
        settings = self.settings.model_dump(mode="json") if hasattr(self.settings, "model_dump") else dict(self.settings)
        return {"item_id": item.item_id, **item.data, "settings": settings, "sampling": asdict(sampling), "recipe": PROMPT_RECIPE}

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        temperature = self.settings.temperature
        if temperature is not None:  # the protocol's own (the field preset: 0.7)
            sampling = replace(sampling, temperature=temperature)
        todo: list[Item] = []
        for item in items:  # measurements stored by an earlier run of this deployment (see the module doc)
            stored = engine.measurement("cost", self._measurement_key(item, sampling))
            if stored is None:
                todo.append(item)
            else:  # a stored layout from before records were versioned is upgraded on the way
                emit([dump_record(parse_record({**stored, "cached": True}, "result cache (cost measurement)"))])
        if not todo:
            return
        store, engine = engine, engine.uncached()  # never serve timings from the cache (a lazy engine loads here)
        # One unrecorded warm-up per concurrency level to measure, on prompts no item uses (negative indices):
        # engines that compile or capture per batch shape (torch.compile, CUDA graphs) do it here, not inside a
        # measured level (on the H200 a first c16 request of a compiled hf deployment read 37 tok/s, not ~1,300).
        # None where the engine says nothing is left to warm (llama.cpp on the CPU once it has computed).
        start = time.perf_counter()
        if engine.prepare_for_timing():
            for c in sorted({item.data["concurrency"] for item in todo}):
                warm = self._requests(engine, -c, c, f"warmup-c{c}", min(WARMUP_TOKENS, self.settings.output_tokens))
                list(engine.generate(warm, sampling))
        warmup_s = time.perf_counter() - start
        info = engine.info()  # after the warm-up: a lazy engine's real description (this run's start-up)
        bandwidth = memory_bandwidth(info, bandwidth_memo(self.binding.run_dir if self.binding is not None else None))
        for item in todo:
            c = item.data["concurrency"]
            reqs = self._requests(engine, item.data["first_request"], c, item.item_id, self.settings.output_tokens)
            with ResourceSampler() as sampler:
                t0 = time.perf_counter()
                results = list(engine.generate(reqs, sampling))
                wall = time.perf_counter() - t0
            record = dump_record(CostRecord(
                item_id=item.item_id,
                category=item.category,
                concurrency=c,
                repeat=item.data["repeat"],
                prompt_tokens=self.settings.prompt_tokens,
                output_tokens_requested=self.settings.output_tokens,
                ignore_eos=True,
                prompt_construction=PROMPT_RECIPE,
                wall_s=wall,
                requests=[
                    CostRequest(key=r.key, prompt_tokens=len(r.prompt_token_ids), prompt_token_ids=r.prompt_token_ids,
                                generation=Generation.of(r))
                    for r in results
                ],
                baseline_rss_mb=sampler.baseline_rss / 2**20,
                peak_rss_mb=sampler.peak_rss / 2**20,
                worker_peak_rss_mb=sampler.high_water() / 2**20,
                server_peak_rss_mb=_server_peak_mb(engine),
                gpu=sampler.gpu_summary(),
                bandwidth=bandwidth,
                startup_s=info.load_s,
                warmup_s=warmup_s,
                engine=info.engine,
                engine_version=info.engine_version,
                n_ctx=info.n_ctx,  # llama.cpp: one context, requests queued through it
                n_threads=info.extra.get("n_threads"),
                sampling={"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.seed},
                cached=False,
                measured_at=utc_now(),
            ))
            store.store_measurement("cost", self._measurement_key(item, sampling), record)
            emit([record])

    def score(self, records: SuiteRecords[CostRecord], ctx: ScoreContext) -> list[ScoreRow]:
        rows: list[ScoreRow] = []
        for dep, recs in typed(records).items():
            levels: dict[int, list[dict[str, float]]] = {}
            for rec in recs:
                levels.setdefault(rec.concurrency, []).append(level_metrics(rec.model_dump(mode="json")))
            for c in sorted(levels):
                per_repeat = levels[c]
                for metric in per_repeat[0]:
                    values = [m[metric] for m in per_repeat if metric in m]
                    rows.append(ScoreRow(dep, self.name, f"c{c}", metric, float(statistics.median(values)), n=len(values)))
            if recs:
                startup = statistics.median(r.startup_s for r in recs)
                rows.append(ScoreRow(dep, self.name, "all", "startup_s", float(startup), n=1))
        return rows

    def item_rows(self, records: SuiteRecords[CostRecord], ctx: ScoreContext) -> list[dict[str, Any]]:
        return [{"item_id": r.item_id, "deployment": dep, **level_metrics(r.model_dump(mode="json"))}
                for dep, recs in typed(records).items() for r in recs]

    def describe(self) -> dict[str, Any]:
        return {
            "concurrency": list(self.settings.concurrency),
            "prompt_tokens": self.settings.prompt_tokens,
            "output_tokens": self.settings.output_tokens,
            "repeats": self.settings.repeats,
            "prompt_construction": PROMPT_RECIPE,
            "aggregation": "per level and repeat: total output tokens / wall time; medians and p90 over requests; median over repeats",
        }


def _workload(settings: CostSettings) -> dict[str, int]:
    """The largest batch: requests that arrive together, and the tokens each holds (prompt + output); an engine that
    decodes them as one batch (hf) holds their KV cache at once."""
    return {"batch_sequences": max(settings.concurrency), "batch_tokens": int(settings.prompt_tokens) + int(settings.output_tokens),
            "batch_prompt_tokens": int(settings.prompt_tokens)}


SPEC = SuiteSpec(
    name="cost",
    settings_model=CostSettings,
    suite_class=CostSuite,
    records=(CostRecord,),
    metrics=METRICS,
    title="Cost: speed and memory",
    report="evalkit.suites.report.cost:section",
    memory="evalkit.suites.report.cost:measured_peak",
    viewer=ViewerSpec(items=False),  # measurements per concurrency level, not items: the report's cost tables show them
    quality=False,  # its metrics are limits under decision.workload, never quality margins
    workload=_workload,
)
