"""Issue 23's full-size run: the whole WikiText-2 test file through `evalkit run`, with the figures it is judged by.

    python benchmarks/bench_fullsize.py [--config benchmarks/fullsize/wikitext2.yaml] [--out DIR] [--streaming N]
    python benchmarks/bench_fullsize.py --measure RUN_DIR      # only the figures of a finished run
    python benchmarks/bench_fullsize.py --streaming 4 --against benchmarks/fullsize/stored-per-chunk.csv

Every measured run leaves <run>/per-chunk.csv (deployment, chunk, scored tokens, NLL sum, KLD sum: what the
scores are made of). `--against CSV` compares a run's with another's chunk by chunk: the streaming run's KLD
against the stored run's (benchmarks/fullsize/stored-per-chunk.csv is the stored run of the closing note), so
the comparison needs no second full-size run.

While the run goes, a sampler thread records disk use by kind every few seconds (records, side files, reference
distributions; in streaming mode the number of reference chunks on disk), so the peak of each is measured, not
inferred from the end state. Afterwards `evalkit report RUN` is timed as its own process (scoring + report) with
its peak RSS, and the per-deployment figures are printed: record bytes per chunk, side-file bytes per scored token.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "benchmarks" / "fullsize" / "wikitext2.yaml"
PY = sys.executable


def _bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except FileNotFoundError:  # deleted between listing and stat (streaming mode)
            pass
    return total


def disk_by_kind(run: Path) -> dict[str, int]:
    dist = [p for p in (run / "distributions").rglob("*.evkld")] if (run / "distributions").exists() else []
    return {
        "records": _bytes(list((run / "records").glob("*.jsonl"))),
        "side_files": _bytes(list((run / "arrays").glob("*.npy"))) if (run / "arrays").exists() else 0,
        "distributions": _bytes(dist),
        "reference_chunks_on_disk": len(dist),
    }


class Sampler(threading.Thread):
    def __init__(self, out_root: Path, period_s: float) -> None:
        super().__init__(daemon=True)
        self.out_root, self.period_s = out_root, period_s
        self.run_path: Path | None = None
        self.peak: dict[str, int] = {}
        self.samples = 0
        self.stop = threading.Event()

    def run_dir(self) -> Path | None:
        runs = sorted(p for p in self.out_root.iterdir() if p.is_dir()) if self.out_root.exists() else []
        return runs[-1] if runs else None

    def run(self) -> None:  # noqa: D401 (threading API)
        while not self.stop.wait(self.period_s):
            self.run_path = self.run_dir()
            if self.run_path is None:
                continue
            for kind, value in disk_by_kind(self.run_path).items():
                self.peak[kind] = max(self.peak.get(kind, 0), value)
            self.samples += 1


def time_v(cmd: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (KB) and exit code of a whole process, by GNU time."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "EVALKIT_RSS_KB=%M", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    sys.stdout.write(proc.stdout[-3000:])
    sys.stderr.write(proc.stderr[-3000:])
    rss = re.findall(r"EVALKIT_RSS_KB=(\d+)", proc.stderr)
    return wall, int(rss[-1]) if rss else -1, proc.returncode


def measure(run: Path, eval_wall_s: float | None) -> None:
    print(f"\nrun {run}")
    report_wall, report_rss_kb, rc = time_v([PY, "-m", "evalkit", "report", str(run)])
    print(f"evalkit report (scoring + report, whole process): {report_wall:.1f} s, peak RSS {report_rss_kb / 1024:.0f} MB, rc {rc}")
    if eval_wall_s:
        print(f"evaluation wall {eval_wall_s:.0f} s; scoring + report = {100 * report_wall / eval_wall_s:.2f}% of it")
    disk = disk_by_kind(run)
    print("disk at the end: " + ", ".join(f"{k} {v:,}" for k, v in disk.items()))
    side_sizes: dict[str, int] = {}
    for path in (run / "arrays").glob("*.npy"):
        side_sizes[path.stem] = path.stat().st_size
    print(f"{'deployment':<18} {'chunks':>6} {'tokens':>9} {'record B/chunk (mean/max)':>26} {'side B/token':>13}")
    for rec_file in sorted((run / "records").glob("*.jsonl")):
        lines = [ln for ln in rec_file.read_bytes().splitlines() if ln.strip()]
        sizes, tokens, side = [], 0, 0
        for ln in lines:
            rec = json.loads(ln)
            if rec.get("suite") != "perplexity":
                continue
            sizes.append(len(ln) + 1)
            payload = rec.get("payload") or rec
            tokens += int(_find(payload, "n_scored") or 0)
            digest = _find(payload, "arrays_sha256")
            side += side_sizes.get(str(digest), 0)
        if not sizes:
            continue
        per_tok = side / tokens if tokens else float("nan")
        print(f"{rec_file.stem:<18} {len(sizes):>6} {tokens:>9} {sum(sizes) / len(sizes):>17.0f} / {max(sizes):>6} {per_tok:>13.2f}")
    print(f"per-chunk sums: {write_per_chunk(run)}")
    scores = run / "scores.csv"
    if scores.exists():
        for line in scores.read_text().splitlines():
            if re.search(r",perplexity,text,(ppl|kld_mean|kld_bound_mean|ppl_ratio|top1_agreement),", line) or line.startswith("deployment"):
                print("  " + line[:200])


PER_CHUNK_FIELDS = ("deployment", "chunk", "n_scored", "nll_sum", "kld_sum")


def per_chunk(run: Path) -> list[dict[str, str]]:
    """One row per perplexity record: the sums every score of the suite is made of (repr: exact floats)."""
    rows = []
    for rec_file in sorted((run / "records").glob("*.jsonl")):
        for ln in rec_file.read_bytes().splitlines():
            rec = json.loads(ln) if ln.strip() else {}
            if rec.get("suite") != "perplexity" or _find(rec, "n_scored") is None:
                continue
            kld = _find(rec, "kld_sum")
            rows.append({"deployment": rec_file.stem, "chunk": str(rec["item_id"]), "n_scored": str(_find(rec, "n_scored")),
                         "nll_sum": repr(_find(rec, "nll_sum")), "kld_sum": "" if kld is None else repr(kld)})
    return rows


def write_per_chunk(run: Path) -> Path:
    out = run / "per-chunk.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, PER_CHUNK_FIELDS)
        w.writeheader()
        w.writerows(per_chunk(run))
    return out


def compare_per_chunk(run: Path, against: Path) -> int:
    """KLD and NLL sums of `run` against the CSV of another run, chunk by chunk; 1 when any differs."""
    with against.open(encoding="utf-8") as f:
        theirs = {(r["deployment"], r["chunk"]): r for r in csv.DictReader(f)}
    ours = {(r["deployment"], r["chunk"]): r for r in per_chunk(run)}
    worst = 0.0
    differ = 0
    for key in sorted(theirs.keys() & ours.keys()):
        for field in ("nll_sum", "kld_sum"):
            a, b = theirs[key][field], ours[key][field]
            if a == b:
                continue
            differ += 1
            if a and b:
                worst = max(worst, abs(float(a) - float(b)))
    only = len(theirs.keys() ^ ours.keys())
    print(f"against {against}: {len(theirs.keys() & ours.keys())} chunks in both, {only} in one only; "
          f"{differ} NLL/KLD sums differ (largest difference {worst:.3g})")
    return 1 if differ or only else 0


def _find(obj: object, key: str) -> object:
    """The first value under `key` anywhere in a record (records nest the measurement; the keys are unique)."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for value in obj.values():
            found = _find(value, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for value in obj:
            found = _find(value, key)
            if found is not None:
                return found
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--out", type=Path, default=Path("/tmp/evalkit-fullsize"))
    ap.add_argument("--streaming", type=int, default=None, help="kld_window: N (streaming exact KLD)")
    ap.add_argument("--measure", type=Path, default=None, help="only measure this finished run directory")
    ap.add_argument("--against", type=Path, default=None, help="per-chunk.csv of another run to compare with")
    ap.add_argument("--period", type=float, default=2.0, help="disk sampling period, seconds")
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, None)
        return compare_per_chunk(args.measure, args.against) if args.against else 0
    config = args.config
    if args.streaming:
        text = config.read_text()
        text = re.sub(r"(kld_reference: [\w-]+)", rf"\1, kld_window: {args.streaming}", text, count=1)
        config = args.out / "streaming.yaml"
        args.out.mkdir(parents=True, exist_ok=True)
        config.write_text(text.replace("../shared", str(ROOT.parent / "shared")))
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(runs, args.period)
    sampler.start()
    wall, rss_kb, rc = time_v([PY, "-m", "evalkit", "run", "--config", str(config), "--out", str(runs), "--no-cache"])
    sampler.stop.set()
    sampler.join()
    print(f"evalkit run: rc {rc}, wall {wall:.0f} s, peak RSS of its largest process (driver or a worker) {rss_kb / 1024:.0f} MB")
    print(f"peaks over {sampler.samples} samples every {args.period:g} s: " + ", ".join(f"{k} {v:,}" for k, v in sampler.peak.items()))
    if rc != 0 or sampler.run_path is None:
        return rc or 1
    measure(sampler.run_path, wall)
    return compare_per_chunk(sampler.run_path, args.against) if args.against else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
