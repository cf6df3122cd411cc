"""vLLM through the whole pipeline: the default config's bf16 reference vs its fp8-weight variant, each in its own
worker process (the session's shared run, conftest.vllm_default_run)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ppl_records import run_records

pytestmark = [pytest.mark.engine, pytest.mark.vllm]


@pytest.fixture(scope="module")
def vllm_run(vllm_default_run: Path) -> tuple[Path, str, str]:
    """The session's run of the default config's vLLM deployments (conftest.vllm_default_run: prompts, two
    perplexity chunks, cost; the memory ledger test reads it too): (run, reference, fp8-weight deployment)."""
    manifest = json.loads((vllm_default_run / "manifest.json").read_text())
    variants = {name: d["variant"] for name, d in manifest["deployments"].items()}
    ref = manifest["reference"]
    others = [n for n, v in variants.items() if v == "fp8-weight"]
    assert variants.get(ref) == "hf" and len(others) == 1, f"these tests need a bf16 `hf` reference and one fp8-weight deployment on vLLM in configs/default.yaml, not {variants}"
    return vllm_default_run, ref, others[0]


def _records(run: Path, dep: str, suite: str) -> list[dict]:
    lines = (run / "records" / f"{dep}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["suite"] == suite]


def test_bf16_and_fp8_weight_differ_but_stay_close(vllm_run: tuple[Path, str, str]) -> None:
    run, bf16, fp8w = vllm_run
    ref = run_records(run, bf16)
    fp8 = run_records(run, fp8w)
    assert ref.keys() == fp8.keys() and ref
    diffs = []
    for item_id, r in ref.items():
        assert r["tokens_sha256"] == fp8[item_id]["tokens_sha256"]  # same tokenizer, same text: same tokens
        diffs += [abs(a - b) for a, b in zip(r["nll"], fp8[item_id]["nll"])]
    mean_diff = sum(diffs) / len(diffs)
    assert 0 < mean_diff < 0.25, mean_diff  # FP8 weight rounding moves every token a little, none a lot
    scores = (run / "scores.csv").read_text()
    kld = [l for l in scores.splitlines() if l.startswith(f"{fp8w},perplexity") and ",kld_mean," in l]
    assert kld and 0 < float(kld[0].split(",")[4]) < 0.1


def test_each_deployment_ran_in_its_own_process_and_exited(vllm_run: tuple[Path, str, str]) -> None:
    run, bf16, fp8w = vllm_run
    engines = {p.stem: json.loads(p.read_text()) for p in (run / "engines").glob("*.json")}
    pids = {name: e["worker_pid"] for name, e in engines.items()}
    assert set(pids) == {bf16, fp8w} and len(set(pids.values())) == 2
    for pid in pids.values():  # each worker has exited, so the OS has its memory back
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert all(e["engine"] == "vllm" for e in engines.values())
    if not _cuda_available():  # each worker's one engine is its process's first: core and model worker run inside it
        assert {e["extra"]["engine_processes"] for e in engines.values()} == {"one (engine core and worker in this process)"}


def test_manifest_states_the_kv_cache_each_deployment_was_given(vllm_run: tuple[Path, str, str]) -> None:
    """Issue 19: the plan's KV figure (manifest ledger, made before anything loaded) is the size the engine gave
    vLLM (engines/<deployment>.json), on CPU max_num_seqs x max_model_len of every layer's K and V, computed
    here from the checkpoint's config.json; the report's ledger table shows the same bytes."""
    run, _, _ = vllm_run
    manifest = json.loads((run / "manifest.json").read_text())
    ledger = {r["deployment"]: r for r in manifest["ledger"]}
    for name in manifest["deployments"]:
        extra = json.loads((run / "engines" / f"{name}.json").read_text())["extra"]
        row = ledger[name]
        assert row["kv_given_bytes"] == extra["kv_cache_bytes"] and row["kv_given_from"] == extra["kv_cache_from"]
        if _cuda_available():
            continue
        options = manifest["config"]["deployments"][[d["name"] for d in manifest["config"]["deployments"]].index(name)]["options"]
        model_dir = Path(json.loads((run / "engines" / f"{name}.json").read_text())["model_path"])
        cfg = json.loads((model_dir / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        per_token = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2 * (2 if extra["dtype"] == "bfloat16" else 4)
        assert extra["kv_cache_bytes"] == options["max_num_seqs"] * options["max_model_len"] * per_token, name
        assert row["kv_bytes"] == extra["kv_cache_bytes"]  # the report's "KV cache" column


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _native_bf16_cpu() -> bool:
    """From /proc/cpuinfo and the oneDNN cap, not from evalkit (an AVX2-only CPU is emulated by the cap)."""
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("AVX2", "AVX", "SSE41", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI")
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and not capped


def test_bf16_reference_computes_in_float32_where_the_cpu_lacks_bf16(vllm_run: tuple[Path, str, str]) -> None:
    run, bf16, _ = vllm_run
    extra = json.loads((run / "engines" / f"{bf16}.json").read_text())["extra"]
    if _cuda_available() or _native_bf16_cpu():
        assert extra["dtype"] == "bfloat16" and "dtype_note" not in extra
    else:
        assert extra["dtype"] == "float32" and "computes in float32 instead of bfloat16" in extra["dtype_note"]


def test_parity_and_hardware_truth_are_reported(vllm_run: tuple[Path, str, str]) -> None:
    run, _, fp8w = vllm_run
    manifest = json.loads((run / "manifest.json").read_text())
    hw = manifest["deployments"][fp8w]["hardware"]
    assert hw["warning"] and "emulat" in (hw["explanation"] + hw["warning"]).lower()
    parity = (run / "parity.csv").read_text(encoding="utf-8-sig").splitlines()
    n = 2 * 2  # prompts: two categories, two items each; one tokenizer and template for both checkpoints
    assert any(line.startswith("prompts,") and f",{n}/{n} identical" in line for line in parity), parity
    report = (run / "report.html").read_text()
    assert fp8w in report and "emulat" in report.lower()


def test_vllm_log_noise_stays_in_the_run_log(vllm_run: tuple[Path, str, str]) -> None:
    run, bf16, _ = vllm_run
    terminal = (run.parent.parent / "terminal.txt").read_text()
    log = (run / "logs" / f"{bf16}.log").read_text()
    assert "INFO" in log and "vllm" in log.lower()  # vLLM's own logging, kept
    assert "INFO" not in terminal and "WARNING" not in terminal.replace("evalkit: warning", "")
    assert f"{bf16} · prompts" in terminal and "elapsed" in terminal
