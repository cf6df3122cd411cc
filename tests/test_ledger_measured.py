"""The memory ledger against what the default deployments really hold on this machine: within ±25%.

A small run per engine of configs/default.yaml's deployments (whatever it holds; conftest.default_engine_run),
engine options unchanged (memory depends on them: n_ctx, max_model_len, max_num_seqs, kv_cache_gb), with the
suites cut to perplexity chunks of the configured length (the largest logits any suite asks for) and the cost
suite, whose records carry the worker's process-tree high-water RSS (vLLM's engine-core and model-worker
processes included). The prediction is the manifest's ledger, made before anything loaded. The vLLM run is
the session's shared one (conftest.vllm_default_run); run the vLLM half holding `flock /tmp/evalkit-vllm.lock`.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DEFAULT_RUN_COST, default_engine_run

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
TOLERANCE = 0.25
ENGINES = ["llamacpp", pytest.param("vllm", marks=pytest.mark.vllm)]


@pytest.fixture(scope="module", params=ENGINES)
def default_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "vllm":
        # The session's run of the default vLLM deployments (conftest.vllm_default_run), which the vLLM pipeline
        # tests read too: one vLLM run serves both. Its prompts suite and second perplexity chunk run before
        # the cost suite, so the high-water RSS there covers them too, and the manifest's ledger is the
        # prediction for that very config.
        return request.getfixturevalue("vllm_default_run")
    suites = {"perplexity": {"text": str(REPO / "texts" / "ppl_default.txt"), "max_chunks": 1, "top_k": 20}, "cost": DEFAULT_RUN_COST}
    return default_engine_run(tmp_path_factory.mktemp(f"ledger-measured-{request.param}"), request.param, suites)


def _measured_peak_bytes(run: Path, dep: str) -> int:
    """The worker's process-tree high-water RSS (or the busiest GPU) over the cost records, MiB in the records."""
    peaks = []
    for line in (run / "records" / f"{dep}.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("suite") == "cost":
            gpus = r.get("gpu") or []
            peaks.append(max(g["peak_mem_mb"] for g in gpus) if gpus else r["worker_peak_rss_mb"])
    assert peaks, f"{dep}: no cost records"
    return int(max(peaks) * 2**20)


def test_every_default_deployment_within_25_percent(default_run: Path) -> None:
    manifest = json.loads((default_run / "manifest.json").read_text())
    rows = {r["deployment"]: r for r in manifest["ledger"]}
    assert rows and set(rows) == set(manifest["deployments"])
    lines, bad = [], []
    for name, row in rows.items():
        assert row["per_device_bytes"] and row["fits"] is True and not row["estimate"], row  # variants prepared first
        measured = _measured_peak_bytes(default_run, name)
        ratio = measured / row["per_device_bytes"]
        lines.append(f"{name} ({row['engine']}): predicted {row['per_device_bytes'] / 1e9:.3f} GB, measured {measured / 1e9:.3f} GB, ratio {ratio:.2f}")
        if not 1 - TOLERANCE <= ratio <= 1 + TOLERANCE:
            bad.append(lines[-1])
    print("\n".join(lines))
    assert not bad, "\n".join(bad)


def test_report_puts_the_measurement_beside_the_prediction(default_run: Path) -> None:
    from evalkit.report.render import context
    from evalkit.results import Run

    ledger = {r["deployment"]: r for r in json.loads((default_run / "manifest.json").read_text())["ledger"]}
    (table,) = [t for s in context(Run(default_run))["sections"] for t in s.tables if t.key == "ledger"]
    assert len(table.rows) == len(ledger)
    for row in table.rows:
        cells = {h: c.value for h, c in zip(table.header, row)}
        measured = _measured_peak_bytes(default_run, cells["deployment"])
        assert cells["measured peak"].startswith(f"{measured / 1e9:.2f} GB")  # bytes / 10^9, not MiB / 10^3
        ratio = measured / ledger[cells["deployment"]]["per_device_bytes"]
        assert float(cells["measured / predicted"]) == pytest.approx(ratio, abs=0.006)
