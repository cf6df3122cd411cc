"""One deployment's work, in its own process: load the engine once (only if a request misses the
engine-result cache), run every suite's pending items.

Run as `python -m evalkit.worker RUN_DIR DEPLOYMENT`. A crash or out-of-memory here loses only this
deployment's unfinished items (finished ones are already on disk), and the memory goes back to the
OS when the process exits, before the next deployment loads.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from evalkit.capabilities import runnable_suites
from evalkit.config import Config
from evalkit.engines import load_engine
from evalkit.engines.base import SamplingParams
from evalkit.errors import EXIT_USER_ERROR, EvalkitError
from evalkit.store import RunDir, atomic_write_text, record_key
from evalkit.suites import enabled_suites
from evalkit.suites.base import RunBinding


def run_deployment(run_dir: Path, deployment_name: str) -> None:
    run = RunDir.open(run_dir)
    manifest = run.manifest()
    config = Config.model_validate(manifest["config"])
    config_file = Path(manifest["config_file"])
    resolved = manifest["deployments"][deployment_name]
    deployment = config.deployment(resolved.get("base", deployment_name))  # a noise-floor rerun uses its base's spec
    # Suites the plan skipped for this deployment (its engine lacks a capability) are not run.
    suites = runnable_suites(enabled_suites(config, config_file), manifest, deployment_name)
    for suite in suites:
        suite.bind(RunBinding(run.path, deployment_name, manifest["reference"]))

    done = run.done_keys(deployment_name)
    pending = {s.name: [i for i in s.items() if record_key(s.name, i.item_id) not in done] for s in suites}
    if not any(pending.values()):
        return

    if manifest.get("use_cache", True):
        # Loads the engine only when a request misses the cache (the first time, at once).
        engine = _open_cached(deployment, resolved, deployment_name)
    else:
        engine = load_engine(deployment.engine, resolved["path"], deployment.options, deployment_name)
    engine_file = run.path / "engines" / f"{deployment_name}.json"
    described = {"deployment": deployment_name, "worker_pid": os.getpid(), **engine.info().__dict__}
    atomic_write_text(engine_file, json.dumps(described, indent=2, default=str) + "\n")
    sampling = SamplingParams(**config.sampling.model_dump())
    with run.writer(deployment_name) as writer:
        for suite in suites:
            items = pending[suite.name]
            if not items:
                continue
            bar = tqdm(total=len(items), desc=f"{deployment_name} · {suite.name}", unit="item", file=sys.stderr)

            def emit(records: list[dict], _bar: tqdm = bar, _suite: str = suite.name) -> None:
                for r in records:
                    r.setdefault("suite", _suite)
                    r["deployment"] = deployment_name
                writer.write_batch(records)
                _bar.update(len(records))

            start = time.perf_counter()
            suite.run(engine, items, sampling, emit)
            bar.close()
            print(f"{deployment_name} · {suite.name}: {len(items)} items in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    stats = engine.run_stats()  # wrappers say what the cache saved and whether the engine loaded at all
    if stats:
        # The real engine's description when it was loaded during this run (its load_s is this run's).
        described.update({"deployment": deployment_name, "worker_pid": os.getpid(), **engine.info().__dict__})
        described.update(stats)
        atomic_write_text(engine_file, json.dumps(described, indent=2, default=str) + "\n")
    engine.close()


def _open_cached(deployment, resolved, deployment_name):  # type: ignore[no-untyped-def]
    from evalkit.cache import open_engine

    return open_engine(deployment, resolved, deployment_name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m evalkit.worker RUN_DIR DEPLOYMENT", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        run_deployment(Path(args[0]), args[1])
    except EvalkitError as e:
        print(f"evalkit: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: vLLM's C++ threads can abort() during it ("terminate called without an
    # active exception") after all records are safely on disk. The process exit returns the memory anyway.
    os._exit(code)
