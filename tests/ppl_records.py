"""Perplexity records in v1's shape for tests: a v2 record (a records line, or a dict straight from the suite
still carrying its side file) with its per-token arrays inline as lists, read through evalkit's own API."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from evalkit.records import parse_record
from evalkit.suites.perplexity.records import PerplexityRecord, token_arrays


def inline(rec: dict[str, Any], run_dir: Path | None = None, tokens: Sequence[int] | None = None,
           bos: int | None = None) -> dict[str, Any]:
    """`rec` plus `nll`, `targets` (the scored ids) and, where stored, `kld`, `argmax`, `same_top` and `top`
    ([[id, logprob], ...] per token). With `tokens` (the text's tokenization with BOS) also `token_ids`, the
    chunk's ids (v2 records keep only their sha256)."""
    parsed = parse_record(rec)
    assert isinstance(parsed, PerplexityRecord) and parsed.scored, rec.get("item_id")
    a = token_arrays(parsed, run_dir)
    names = a.dtype.names or ()
    out = {k: v for k, v in rec.items() if k != "side_file"}
    out["nll"] = a["nll"].astype(np.float64).tolist()
    out["targets"] = a["token"].tolist()
    for f in ("kld", "argmax", "same_top"):
        if f in names:
            out[f] = a[f].tolist()
    if "top_ids" in names and a.dtype["top_ids"].shape and a.dtype["top_ids"].shape[0]:
        out["top"] = [[[int(i), float(lp)] for i, lp in zip(ids, lps) if np.isfinite(lp)]
                      for ids, lps in zip(a["top_ids"], a["top_lp"].astype(np.float64))]
    if tokens is not None and "token_ids" not in rec:
        n_ctx, i = int(rec["n_ctx"]), int(rec["chunk_index"])
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if rec.get("bos_replaced"):
            chunk[0] = bos if bos is not None else tokens[0]  # tokenized with BOS: the first token is it
        assert chunk[rec["scored_from"]:] == out["targets"]
        if rec.get("tokens_sha256"):
            from evalkit.metrics.kld import tokens_sha256

            assert tokens_sha256(chunk) == rec["tokens_sha256"], rec["item_id"]
        out["token_ids"] = chunk
    return out


def scored(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunk records (not the placeholders past the end of the text)."""
    return [r for r in records if "arrays_sha256" in r or "nll" in r]


def run_text_tokens(run: Path, deployment: str) -> tuple[list[int], int | None]:
    """The run's perplexity text tokenized as `deployment` tokenized it (its tokenizer-only loader), and
    its BOS id: what rebuilds a v2 record's chunk ids."""
    import json

    from evalkit.config import Config
    from evalkit.engines.tokenizer import load_tokenizer
    from evalkit.suites.perplexity import PerplexitySuite

    manifest = json.loads((run / "manifest.json").read_text())
    config = Config.model_validate(manifest["config"])
    dep = config.deployment(deployment)
    tok = load_tokenizer(dep.engine, manifest["deployments"][deployment]["path"], dep.options)
    try:
        text = PerplexitySuite(config.suites.perplexity, config, Path(manifest["config_file"])).text()
        return list(tok.tokenize(text, add_bos=True)), None  # a BOS-replaced chunk takes tokens[0] (the BOS)
    finally:
        tok.close()


def run_records(run: Path, deployment: str, tokens: bool = False) -> dict[str, dict[str, Any]]:
    """item id -> inlined scored perplexity record of `deployment` in the run directory `run`."""
    from evalkit.store import read_jsonl

    text = run_text_tokens(run, deployment) if tokens else (None, None)
    return {r["item_id"]: inline(r, run, *text) for r in read_jsonl(run / "records" / f"{deployment}.jsonl")
            if r["suite"] == "perplexity" and ("arrays_sha256" in r or "nll" in r)}
