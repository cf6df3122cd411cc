"""`python -m evalkit <verb>`: run, report, prepare, doctor, plan, rate, view, diff, history."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evalkit import __version__
from evalkit.errors import EXIT_USER_ERROR, EvalkitError


def _cmd_run(args: argparse.Namespace) -> int:
    from evalkit.pipeline import run

    run_dir = run(args.config, Path(args.out), Path(args.resume) if args.resume else None, use_cache=not args.no_cache,
                  strict=args.strict, executor=args.executor, ray_address=args.ray_address)
    print(f"evalkit: report at {run_dir.path / 'report.html'}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from evalkit.report.render import render_report
    from evalkit.scoring import score_run
    from evalkit.store import RunDir

    run = RunDir.open(Path(args.run_dir))
    score_run(run)
    render_report(run)
    print(f"evalkit: report at {run.path / 'report.html'}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from evalkit.config import load_config
    from evalkit.variants import prepare_all

    config, _ = load_config(args.config)
    for name, path in prepare_all(config, force=args.force):
        print(f"{name}: {path}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from evalkit.config import load_config
    from evalkit.gpu_plan import doctor_section
    from evalkit.hardware import doctor

    config, config_file = load_config(args.config)  # before printing anything: a bad config is one line, exit 2
    print(doctor())
    print()
    print(doctor_section(config, config_file))  # each deployment on this machine's GPU, by its engine's rules
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from evalkit.config import load_config
    from evalkit.ledger import format_ledger, ledger_table

    from evalkit.gpu_plan import format_verdicts, refusals, verdicts

    config, config_file = load_config(args.config)
    from evalkit.preflight import check_formats

    check_formats(config, config_file)  # an unknown or unsupported quantization format: one line, exit 2
    rows = ledger_table(config, config_file)
    gpu, found = verdicts(config, config_file, rows)  # hardware truth for a named GPU (none named: nothing)
    if args.json:
        import json

        on_gpu = {v.deployment: v.plan_json() for v in found}
        print(json.dumps([{**r.plan_json(), **({"gpu_precision": on_gpu[r.deployment]} if r.deployment in on_gpu else {})}
                          for r in rows], indent=2))
    else:
        print(format_ledger(rows))
        if gpu is not None:
            print(format_verdicts(gpu, found, max(1, config.hardware.gpu_count() if config.hardware is not None else 1)))
        from evalkit.capabilities import plan_skips
        from evalkit.suites import all_specs

        grouped: dict[tuple[str, str], list[str]] = {}
        for skip in plan_skips(config, config_file):  # what each deployment will not run, and why
            grouped.setdefault((skip.deployment, skip.reason), []).append(skip.suite)
        for (name, reason), suites in grouped.items():
            print(f"{name}: does not run {', '.join(suites)}: {reason}")

        for spec in all_specs():  # each enabled suite's own plan lines (SuiteSpec.plan_note)
            note = spec.plan_note(config, config_file) if spec.plan_note and config.suites.get(spec.name) else None
            if note:
                print(note)
        from evalkit.margin_plan import margin_plans

        for plan in margin_plans(config, config_file):  # can the suites' sizes show the margins at all?
            print(plan.line())
    errors = refusals(found, config_file)
    for e in errors:  # a deployment that cannot run on the named GPU: one line each, exit 2
        print(f"evalkit: error: {e}", file=sys.stderr)
    if errors:
        return EXIT_USER_ERROR
    # The disk the run will need, by kind; a run that cannot fit under --out is refused in one line (exit 2).
    from evalkit.diskplan import check_disk, disk_plan
    from evalkit.models import cache_dir

    disk = disk_plan(config, config_file)
    if not args.json:
        print("\n".join(disk.lines()))
    check_disk(disk, Path(args.out), cache_dir())
    return 0


def _cmd_rate_export(args: argparse.Namespace) -> int:
    from evalkit.rating.export import export_sheets

    for path in export_sheets(Path(args.run_dir), raters=args.raters, fmt=args.format, mode=args.mode, seed=args.seed):
        print(path)
    return 0


def _cmd_rate_import(args: argparse.Namespace) -> int:
    from evalkit.rating.aggregate import refresh_tidy_tables
    from evalkit.rating.import_ import import_sheets

    summary = import_sheets(Path(args.run_dir), [Path(p) for p in args.sheets])
    refresh_tidy_tables(Path(args.run_dir))  # the ratings rows of scores.csv / comparisons.csv follow the sheets
    print(summary)
    return 0


def _cmd_judge(args: argparse.Namespace) -> int:
    import json

    from evalkit.judge.run import judge_settings_of, run_judge
    from evalkit.pipeline import resolve_deployment
    from evalkit.report.render import render_report
    from evalkit.scoring import score_run
    from evalkit.store import RunDir

    run = RunDir.open(Path(args.run_dir))
    settings, config_file = judge_settings_of(run, Path(args.config) if args.config else None)  # before any call
    with run.exclusive():
        cost = run_judge(run.path, settings, config_file, resolve_deployment, use_cache=not args.no_cache)
        score_run(run)
        render_report(run)
    print(json.dumps(cost, sort_keys=True))
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    import os

    from evalkit.viewer.app import serve

    serve(Path(args.reports_dir), host=args.host, port=args.port, allow_remote=args.allow_remote,
          password=os.environ.get("EVALKIT_VIEW_PASSWORD") or None)
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from evalkit.diffcli import run_diff

    return run_diff(args)


def _cmd_history(args: argparse.Namespace) -> int:
    from evalkit.diffcli import run_history

    return run_history(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evalkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"evalkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser("run", help="evaluate every deployment of a config and write a report")
    p.add_argument("--config", help="YAML config (default: the embedded configs/default.yaml)")
    p.add_argument("--out", default="reports", help="where run directories are created (default: reports/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="finish an interrupted run (its own config is used)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the engine-result cache")
    p.add_argument("--strict", action="store_true", help="refuse a suite a deployment's engine cannot run (default: skip it)")
    p.add_argument("--executor", choices=["local", "ray"], help="where units run (default: the config's executor.kind, local)")
    p.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster ('auto' or HOST:PORT); default: start a local Ray")
    p.set_defaults(func=_cmd_run)

    p = verbs.add_parser("report", help="re-score and re-render a run from its records (never loads a model)")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.set_defaults(func=_cmd_report)

    p = verbs.add_parser("prepare", help="make the model variants a config asks for (hf, fp8-weight, GGUF ladder)")
    p.add_argument("--config", help="YAML config (default: the embedded one)")
    p.add_argument("--force", action="store_true", help="rebuild variants even when cached")
    p.set_defaults(func=_cmd_prepare)

    p = verbs.add_parser("doctor", help="what this machine can really run (devices, FP8 support, engines)")
    p.add_argument("--config", help="YAML config whose deployments to check on this machine's GPU (default: the embedded one)")
    p.set_defaults(func=_cmd_doctor)

    p = verbs.add_parser("plan", help="the memory ledger of a config, without loading anything")
    p.add_argument("config", nargs="?", metavar="CONFIG", help="YAML config (default: the embedded one)")
    p.add_argument("--json", action="store_true", help="one JSON record per deployment (GB = 10^9 bytes; unknown = null)")
    p.add_argument("--out", default="reports", help="where the run would be written: its disk is checked (default: reports/)")
    p.set_defaults(func=_cmd_plan)

    rate = verbs.add_parser("rate", help="blind human-rating sheets: export, import").add_subparsers(
        dest="rate_verb", required=True, metavar="ACTION"
    )
    p = rate.add_parser("export", help="write one blind rating sheet per rater")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--raters", type=int, default=2)
    p.add_argument("--format", choices=["csv", "xlsx"], default="csv")
    p.add_argument("--mode", choices=["absolute", "pairwise"], default="absolute")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_rate_export)
    p = rate.add_parser("import", help="validate and import filled rating sheets (all rows or none)")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("sheets", nargs="+", metavar="SHEET")
    p.set_defaults(func=_cmd_rate_import)

    p = verbs.add_parser("judge", help="grade a run's outputs with a model judge, then re-score and re-render it")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--config", help="YAML with a `judge:` block (default: the run's own config's)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the engine-result cache")
    p.set_defaults(func=_cmd_judge)

    p = verbs.add_parser("view", help="browse runs in a local web viewer (items, run against run, blind review)")
    p.add_argument("reports_dir", nargs="?", default="reports", metavar="REPORTS_DIR",
                   help="folder of run directories (default: reports/); a run directory opens at that run")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine only)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a --host other machines reach; needs the password in EVALKIT_VIEW_PASSWORD")
    p.set_defaults(func=_cmd_view)

    from evalkit.diffcli import add_diff_parsers

    add_diff_parsers(verbs, _cmd_diff, _cmd_history)
    return parser


def disk_full(e: OSError) -> bool:
    import errno

    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def main(argv: list[str] | None = None) -> int:
    from evalkit.interrupts import keep_interrupts

    keep_interrupts()  # Ctrl-C landing in a destructor still stops the run
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EvalkitError as e:
        print(f"evalkit: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("evalkit: interrupted; finished items are kept (use run --resume RUN_DIR)", file=sys.stderr)
        return 130
    except OSError as e:
        if not disk_full(e):
            raise
        print(f"evalkit: error: {e.filename or 'a file'}: no space left on the device ({e.strerror}); every complete "
              f"record is kept: free space, then `run --resume RUN_DIR` (or `report RUN_DIR`)", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
