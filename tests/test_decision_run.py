"""The decision on a real run: SmolLM2-135M-Instruct Q4_1 (reference) against Q8_0 and Q2_K made from it.

What must come out is known without evalkit: Q2_K loses much more than 5% perplexity against its source
(llama.cpp's published ladder: Q2_K is the mix with by far the largest perplexity increase), while Q8_0
re-rounds the Q4_1 weights to 8 bits and so loses next to nothing against them. The run is the session's
real run (tests/conftest.py) cut to the suites the decision reads (perplexity, MMLU, cost) with Q8_0 added:
same settings, same engine cache, so only Q8_0's items and the cost measurements run here. It is then
re-decided from its files alone with other margins.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REAL_RUN_CONFIG, REPO

pytestmark = pytest.mark.engine

DECISION_SUITES = ("perplexity", "mmlu", "cost")


def _config() -> dict:
    """The session run's config (its suites' sizes, sampling, decision block) with Q8_0 beside Q4_1 and Q2_K."""
    config = yaml.safe_load(REAL_RUN_CONFIG.format(repo=REPO, humaneval="unused"))
    q4 = next(d for d in config["deployments"] if d["name"] == config["reference"])
    config["deployments"].insert(1, {**q4, "name": "q8", "model": {"source": q4["model"], "variant": "Q8_0"}, "options": dict(q4["options"])})
    config["suites"] = {k: v for k, v in config["suites"].items() if k in DECISION_SUITES}
    config["decision"]["scenarios"] = [{"name": "one user", "concurrency": 1, "context_tokens": 1024}]
    return config


@pytest.fixture(scope="module")
def run_dir(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """After the session run (`real_run`), whose engine results for q4 and q2k this run finds in the cache."""
    config = _config()
    assert [d["name"] for d in config["deployments"]] == ["q4", "q8", "q2k"]
    assert config["decision"]["margins"] == {"perplexity/ppl_ratio": 1.05, "mmlu/accuracy": -0.25}
    cfg = tmp_path_factory.mktemp("cfg") / "decision.yaml"
    cfg.write_text(yaml.safe_dump(config))
    out = tmp_path_factory.mktemp("runs")
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(cfg), "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def test_real_run_decides(run_dir: Path) -> None:
    dec = json.loads((run_dir / "decision.json").read_text())
    margins = {d["deployment"]: {m["key"]: m for m in d["margins"]} for d in dec["deployments"]}
    assert margins["q2k"]["perplexity/ppl_ratio"]["decision"] == "inferior"
    assert margins["q8"]["perplexity/ppl_ratio"]["decision"] == "non-inferior"
    assert margins["q2k"]["perplexity/ppl_ratio"]["ci_low"] > 1.05
    assert dec["recommended"] in ("q4", "q8")
    assert [s["name"] for s in dec["scenarios"]] == ["workload", "one user"]
    for d in dec["deployments"]:
        assert d["memory_ok"] is True  # 135M on this machine's RAM
        assert d["cost"]["how"] == "measured at concurrency 2" and d["cost"]["tokens_per_s"] > 0
    comps = pd.read_csv(run_dir / "comparisons.csv", encoding="utf-8-sig")
    ratio = comps[(comps.metric == "ppl_ratio")].set_index("deployment")
    assert ratio.loc["q2k", "decision"] == "inferior" and ratio.loc["q2k", "margin"] == 1.05
    assert comps[comps.margin.isna()].decision.isna().all()  # empty where no margin applies
    html = (run_dir / "report.html").read_text()
    assert html.index('id="decision"') < html.index('id="verdict"')  # the decision opens the report
    assert dec["summary"] in html.replace("&#39;", "'") and 'id="plot-decision"' in html
    assert "## Decision" in (run_dir / "report.md").read_text()


def test_report_re_decides_from_records_alone(run_dir: Path, tmp_path: Path) -> None:
    """Edit the margins in the manifest's config, delete decision.json: `evalkit report` decides anew.

    On a copy: the module's run stays as `evalkit run` left it for the other tests, whatever their order."""
    run_dir = Path(shutil.copytree(run_dir, tmp_path / run_dir.name))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"]["decision"]["margins"] = {"perplexity/ppl_ratio": 100.0}  # everything passes
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "decision.json").unlink()
    proc = subprocess.run([sys.executable, "-m", "evalkit", "report", str(run_dir)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dec = json.loads((run_dir / "decision.json").read_text())
    assert all(d["qualifies"] for d in dec["deployments"])
    # the rule: the highest throughput; within 5% of it counts as tied, and the least memory wins among tied
    tps = {d["deployment"]: d["cost"]["tokens_per_s"] for d in dec["deployments"]}
    mem = {d["deployment"]: d["memory"]["per_device_gb"] for d in dec["deployments"]}
    tied = [d for d in tps if tps[d] >= 0.95 * max(tps.values())]
    assert dec["recommended"] == min(tied, key=mem.get)


def test_notebook_api_re_decides(run_dir: Path) -> None:
    import evalkit

    run = evalkit.load_run(run_dir)
    assert run.decision is not None and run.decision.recommended == json.loads((run_dir / "decision.json").read_text())["recommended"]
    strict = run.decide(margins={"perplexity/ppl_ratio": 0.5})  # nothing but the reference can pass
    assert strict.recommended == "q4"
    table = strict.table()
    assert set(table.deployment) == {"q4", "q8", "q2k"}
    assert set(table.loc[table.deployment != "q4", "perplexity/ppl_ratio"]) == {"inferior"}


def test_decision_notebook_runs_on_the_real_run(run_dir: Path) -> None:
    from test_notebooks import execute

    nb = execute("03_decision.ipynb", {"EVALKIT_RUN": str(run_dir)}, run_dir)  # restores EVALKIT_RUN afterwards

    def out(tag: str) -> str:
        (cell,) = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
        parts = [o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
                 for o in cell.outputs]
        return "\n".join(parts)

    summary = json.loads((run_dir / "decision.json").read_text())["summary"]
    assert summary in out("stated")
    assert "interpolated" not in out("loads").split("\n")[0]  # a measured level first
    assert "q2k" in out("margins") or "q4" in out("margins")
