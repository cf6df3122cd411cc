"""The staged runner: config -> run directory -> one worker process per deployment -> scores -> report."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evalkit import __version__
from evalkit.config import Config, load_config
from evalkit.engines import SERVED_KIND, engine_spec
from evalkit.environment import accelerators, library_versions, machine
from evalkit.errors import EvalkitError, ModelFileError
from evalkit.executors import Executor, make_executor
from evalkit.executors.local import LocalExecutor
from evalkit.models import check_model, fingerprint, resolve_source
from evalkit.store import RunDir


def resolve_deployments(config: Config) -> dict[str, dict[str, Any]]:
    """Every deployment's model on disk (variants prepared if needed), checked and fingerprinted. A served
    model is "kind": "served", with its endpoint and whether evalkit knows its weights (`model:` named)."""
    out = {dep.name: resolve_deployment(dep) for dep in config.deployments}
    if config.noise_floor:
        out[config.reference + NOISE_SUFFIX] = {**out[config.reference], "base": config.reference, "replicate": 1}
    return out


def resolve_deployment(dep: Any) -> dict[str, Any]:
    """One deployment's manifest entry (resolve_deployments; the judge's too)."""
    spec = engine_spec(dep.engine)
    entry: dict[str, Any] = {"engine": dep.engine, "source": None, "variant": None, "path": None, "kind": None,
                             "sha256": None, "size_bytes": None}
    if dep.model is not None:
        path = _model_path(dep)
        kind = check_model(path, dep.model.source)
        if not spec.loads_kind(kind):
            raise ModelFileError(
                str(path), f"deployment {dep.name}: engine {dep.engine} needs a {spec.model_kind} model, got a {kind} checkpoint"
            )
        fp = fingerprint(path)
        entry |= {"source": dep.model.source, "variant": dep.model.variant, "path": str(path), "kind": kind,
                  "sha256": fp.sha256, "size_bytes": fp.size_bytes}
    if spec.served:
        entry |= {"kind": SERVED_KIND, "weights_kind": entry["kind"],
                  "weights": "named" if dep.model is not None else "not verified",
                  "endpoint": spec.endpoint(dep.options) if spec.endpoint is not None else None}
    return {**entry, "hardware": _hardware(dep)}


def _model_path(dep: Any) -> Path:
    """The deployment's model file or directory, its variant prepared first when it names one."""
    if dep.model.variant is not None:
        from evalkit.variants import prepare_variant

        return Path(prepare_variant(dep.model.source, dep.model.variant))
    return resolve_source(dep.model.source)


def _prepares_variants(config: Config) -> bool:
    """Whether the run will first prepare a model variant (seconds to minutes) that is not in the cache yet."""
    from evalkit.variants import built_variant

    for dep in config.deployments:
        if dep.model is not None and dep.model.variant is not None:
            try:
                if built_variant(dep.model.source, dep.model.variant) is None:
                    return True
            except Exception:  # a bad source is new_run's to report, in one line
                return False
    return False


def _hardware(dep: Any) -> dict[str, Any] | None:
    try:
        from evalkit.hardware import deployment_hardware
    except ImportError:
        return None
    return deployment_hardware(dep)


NOISE_SUFFIX = ".rerun"


def ordered_deployments(config: Config) -> list[str]:
    """Reference first; with `noise_floor`, the reference again (uncached) right after it, so the report can
    show how much the engine itself varies between two identical runs."""
    names = [d.name for d in config.deployments]
    rerun = [config.reference + NOISE_SUFFIX] if config.noise_floor else []
    return [config.reference] + rerun + [n for n in names if n != config.reference]


def new_run(config: Config, config_file: Path, out_dir: Path, use_cache: bool, strict: bool = False,
            executor: str | None = None) -> RunDir:
    from evalkit.capabilities import check_capabilities, grouped_skips
    from evalkit.preflight import check_engines, preflight

    # Before creating anything: a mistake in suite data or a bad model file writes nothing.
    check_engines(config)  # each engine's own checks first (a served model's server must answer)
    skipped = check_capabilities(config, config_file, strict)  # (deployment, suite) pairs an engine cannot run
    suites = preflight(config, config_file)  # cheap: read all suite data first
    for (deployment, reason), suites_skipped in grouped_skips(skipped).items():
        print(f"evalkit: {deployment} skips {', '.join(suites_skipped)}: {reason}", file=sys.stderr)
    from evalkit.diskplan import check_disk, disk_plan
    from evalkit.models import cache_dir

    # Disk known in advance: a run whose files cannot fit is refused before anything is written.
    check_disk(disk_plan(config, config_file, use_cache), out_dir, cache_dir() if use_cache else None)
    deployments = resolve_deployments(config)
    ledger = _ledger(config, config_file)
    _refuse_what_does_not_fit(config_file, ledger, local=(executor or config.executor.kind) == "local")
    run = RunDir.create(out_dir)
    run.write_manifest(
        {
            "run_id": run.path.name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "evalkit_version": __version__,
            "config_file": str(config_file.resolve()),
            "config": config.model_dump(mode="json"),
            "reference": config.reference,
            "deployment_order": ordered_deployments(config),
            "deployments": deployments,
            "skipped": skipped,  # (deployment, suite) pairs the engine cannot run, with the reason
            "use_cache": use_cache,
            "ledger": ledger,
            "suites": suites,
            "environment": {"machine": machine(), "accelerators": accelerators(), "libraries": library_versions()},
        }
    )
    return run


def _ledger(config: Config, config_file: Path) -> list[dict[str, Any]]:
    """The memory prediction, made before anything loads; the report puts measured peaks beside it."""
    from dataclasses import asdict

    from evalkit.ledger import ledger_table

    try:
        return [asdict(r) for r in ledger_table(config, config_file)]
    except Exception as e:  # a prediction must never stop a run
        print(f"evalkit: warning: memory ledger not computed: {e}", file=sys.stderr)
        return []


def _refuse_what_does_not_fit(config_file: Path, ledger: list[dict[str, Any]], local: bool) -> None:
    """A deployment the plan says this machine cannot hold stops the run here, in one line with the figures,
    not as an engine's traceback later. Ray runs only warn: the driver is not the machine the units run on."""
    from evalkit.errors import ConfigError
    from evalkit.ledger import unfit_line

    line = unfit_line(ledger)
    if line is None:
        return
    if not local:
        print(f"evalkit: warning: {line}", file=sys.stderr)
        return
    raise ConfigError(str(config_file), line)


def run_workers(run: RunDir, names: list[str], executor: Executor | None = None) -> dict[str, int]:
    """Every unit of the named deployments on `executor` (default: local); exit code per deployment.
    A failed deployment doesn't stop the run."""
    return (executor or make_executor("local")).run(run, names)


def pending_items(run: RunDir, name: str) -> int:
    """How many items of a deployment have no record yet (0: it finished, whatever its exit code)."""
    from evalkit.capabilities import runnable_suites
    from evalkit.scoring import score_context
    from evalkit.store import record_key
    from evalkit.suites import enabled_suites

    ctx, config = score_context(run)
    done = run.done_keys(name)
    suites = runnable_suites(enabled_suites(config, ctx.config_file), run.manifest(), name)
    return sum(1 for s in suites for i in s.items() if record_key(s.name, i.item_id) not in done)


def warn_hardware(run: RunDir) -> None:
    for name, dep in run.manifest()["deployments"].items():
        warning = (dep.get("hardware") or {}).get("warning")
        if warning:
            print(f"evalkit: warning: {name}: {warning}", file=sys.stderr)


def _run_and_report(run_dir: RunDir, names: list[str], executor: Executor) -> dict[str, int]:
    with run_dir.exclusive():  # a second run --resume of this directory is refused, not run twice
        print(f"evalkit: run directory {run_dir.path}", file=sys.stderr, flush=True)
        warn_hardware(run_dir)
        import threading

        threading.Thread(target=_import_for_the_report, name="evalkit-report-imports", daemon=True).start()
        codes = run_workers(run_dir, names, executor)
        _judge(run_dir)
        from evalkit.scoring import score_run
        from evalkit.report.render import render_report

        try:
            score_run(run_dir)
            render_report(run_dir)
        except OSError as e:
            import errno

            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # The disk filled: one line naming the run; every complete record and side file is kept.
            raise EvalkitError(str(run_dir.path), f"no space left on the device ({e.strerror}); every complete record "
                                                  f"is kept: free space, then run --resume {run_dir.path}") from None
    return codes


def _import_for_the_report() -> None:
    """What scoring and the report import (scipy.special, matplotlib, the report's modules: ~1 s of one core on a
    2-core CPU), imported while the workers compute, so the report follows the last deployment sooner. A
    failure here is left to the real import, which reports it. Not scipy.stats: only a bootstrap of 50 rated
    items or more needs it (evalkit.metrics.stats)."""
    try:
        import evalkit.report.render
        import evalkit.scoring  # noqa: F401
        import scipy.special  # noqa: F401
        from matplotlib.backends import backend_agg  # noqa: F401
        from matplotlib import figure  # noqa: F401
    except Exception:
        pass


def _judge(run_dir: RunDir) -> None:
    """The config's model judge grades the outputs (evalkit.judge), once every deployment has run."""
    manifest = run_dir.manifest()
    config = Config.model_validate(manifest["config"])
    if config.judge is None:
        return
    from evalkit.judge.run import run_judge

    run_judge(run_dir.path, config.judge, Path(manifest["config_file"]), resolve_deployment,
              use_cache=bool(manifest.get("use_cache", True)))


def choose_executor(config: Config, kind: str | None, address: str | None) -> Executor:
    """The command line's choice over the config's `executor:` block."""
    settings = config.executor
    kind = kind or ("ray" if address else settings.kind)
    address = address if address is not None else settings.address
    return make_executor(kind, address=address, max_attempts=settings.max_attempts, namespace=settings.namespace)


def run(
    config_path: str | None,
    out_dir: Path,
    resume: Path | None,
    use_cache: bool = True,
    strict: bool = False,
    executor: str | None = None,
    ray_address: str | None = None,
) -> RunDir:
    if resume is not None:
        run_dir = RunDir.open(resume)
        manifest = run_dir.manifest()
        names = manifest["deployment_order"]
        config = Config.model_validate(manifest["config"])
    else:
        config, config_file = load_config(config_path)
        names = ordered_deployments(config)
    chosen = choose_executor(config, executor, ray_address)
    if isinstance(chosen, LocalExecutor) and resume is None and _prepares_variants(config):
        chosen.prestart(config.deployment(names[0]).engine)  # it imports its engine while variants are made
    try:
        if resume is not None:
            from evalkit.preflight import check_engines, preflight

            # The suite data may have moved or changed since the run started: say so before any worker starts.
            check_engines(config)
            preflight(config, Path(manifest["config_file"]))
        else:
            run_dir = new_run(config, config_file, out_dir, use_cache, strict=strict, executor=executor)
        codes = _run_and_report(run_dir, names, chosen)
    finally:
        if isinstance(chosen, LocalExecutor):
            chosen.discard_prestarted()
    # Finished means every item recorded, whatever the exit code: a worker that exits 0 with items still
    # pending has failed, and one that crashed after its last record (an engine at teardown) has not.
    failed = [n for n in codes if pending_items(run_dir, n)]
    if failed:
        raise EvalkitError(str(run_dir.path), f"deployment(s) {', '.join(failed)} did not finish; rerun with --resume {run_dir.path}")
    return run_dir
