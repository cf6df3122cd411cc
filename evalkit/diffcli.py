"""The `diff` and `history` verbs of the command line (evalkit.cli adds them; the work is in evalkit.diff and
evalkit.history, imported when a verb runs). Nothing is written before every input has been read and checked:
a mistake is one line naming the file and the problem, exit 2."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

DIFF_HELP = "did anything get worse between two runs? paired statistics on the shared items, exit 1 on a regression"
HISTORY_HELP = "every run of a reports folder: what each result depends on, what changed, a metric over time"


def add_diff_parsers(verbs: Any, diff: Callable[..., int], history: Callable[..., int]) -> None:
    p = verbs.add_parser("diff", help=DIFF_HELP, description=DIFF_HELP + ". Exit codes: 0 no margin crossed, "
                         "1 a regression beyond a margin, 2 bad input or nothing comparable.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="BASELINE NEW (or BASELINE..NEW); with --baseline, only NEW")
    p.add_argument("--baseline", metavar="REPORTS_DIR",
                   help="compare NEW with the latest comparable run in this folder (created before NEW)")
    p.add_argument("--margin", action="append", default=[], metavar="KEY=VALUE",
                   help="largest acceptable loss, as decision.margins (SUITE/METRIC=VALUE or SUITE/CATEGORY/METRIC=VALUE: "
                        "-0.02 for a share that may drop 2 points, 1.05 for a ratio that may grow 5%%); "
                        "adds to / overrides the new run's config margins; repeatable")
    p.add_argument("--no-config-margins", action="store_true", help="ignore the new run's decision.margins")
    p.add_argument("--fail-on", choices=["inferior", "inconclusive"], default="inferior",
                   help="exit 1 when a margin is inferior (default), or also when it is inconclusive")
    p.add_argument("--pair", action="append", default=[], metavar="NEW=BASELINE",
                   help="compare deployment NEW of the new run with BASELINE of the baseline run (default: same names)")
    p.add_argument("--all", action="store_true", help="every category and metric on the terminal (CSV/JSON always have all)")
    p.add_argument("--csv", metavar="FILE", help="write every comparison row as CSV ('-': standard output)")
    p.add_argument("--json", metavar="FILE", help="write the whole diff as JSON ('-': standard output)")
    p.set_defaults(func=diff)

    p = verbs.add_parser("history", help=HISTORY_HELP, description=HISTORY_HELP + ".")
    p.add_argument("reports_dir", nargs="?", default="reports", metavar="REPORTS_DIR")
    p.add_argument("--metric", metavar="SUITE/METRIC",
                   help="show this metric per run and deployment (suite/category/metric for one category)")
    p.add_argument("--csv", metavar="FILE", help="write the tidy history (load_history's frame) as CSV ('-': standard output)")
    p.add_argument("--json", metavar="FILE", help="write every run's keys and scores as JSON ('-': standard output)")
    p.set_defaults(func=history)


def _runs(args: argparse.Namespace, unsaved: dict[str, Any]) -> tuple[Path, Path]:
    from evalkit.errors import ConfigError
    from evalkit.diff import latest_comparable

    runs = list(args.runs)
    if len(runs) == 1 and ".." in runs[0] and not Path(runs[0]).exists():
        runs = runs[0].split("..", 1)
    if args.baseline:
        if len(runs) != 1:
            raise ConfigError("evalkit diff", "with --baseline REPORTS_DIR, name only the new run")
        return latest_comparable(Path(runs[0]), Path(args.baseline), unsaved), Path(runs[0])
    if len(runs) != 2:
        raise ConfigError("evalkit diff", "name two runs (BASELINE NEW, or BASELINE..NEW), or one with --baseline REPORTS_DIR")
    return Path(runs[0]), Path(runs[1])


def _write(target: str, text: str) -> None:
    if target == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from evalkit.fileio import atomic_write_bytes

    try:
        atomic_write_bytes(Path(target), text.encode("utf-8"))
    except OSError as e:
        from evalkit.errors import EvalkitError

        raise EvalkitError(target, f"cannot write ({e.strerror or e})") from None


def _check_target(target: str | None) -> None:
    """A file we are asked to write must be writable before any work (one line, exit 2, nothing written)."""
    if not target or target == "-":
        return
    from evalkit.errors import EvalkitError

    path = Path(target)
    if path.is_dir():
        raise EvalkitError(target, "is a directory; name a file")
    if not path.parent.is_dir():
        raise EvalkitError(target, "its folder does not exist")


def run_diff(args: argparse.Namespace) -> int:
    from evalkit.diff import diff_runs, format_csv, format_json, format_text, parse_margins
    from evalkit.errors import ConfigError

    margins = parse_margins(args.margin)
    pairs = []
    for p in args.pair:
        new, sep, base = p.partition("=")
        if not sep or not new or not base:
            raise ConfigError("--pair", f"{p!r}: expected NEW_DEPLOYMENT=BASELINE_DEPLOYMENT")
        pairs.append((new, base))
    for target in (args.csv, args.json):
        _check_target(target)
    unsaved: dict[str, Any] = {}  # --baseline's history index, written only once the diff has succeeded
    baseline, new = _runs(args, unsaved)
    result = diff_runs(baseline, new, margins, pairs=pairs or None, config_margins=not args.no_config_margins,
                       fail_on=args.fail_on)
    to_stdout = "-" in (args.csv, args.json)
    if not to_stdout:
        print(format_text(result, every_row=args.all))
    if args.csv:
        _write(args.csv, format_csv(result))
    if args.json:
        _write(args.json, format_json(result))
    if unsaved:
        from evalkit.history import save_index

        save_index(Path(args.baseline), unsaved)
    return result.exit_code


def run_history(args: argparse.Namespace) -> int:
    import json

    from evalkit.errors import ConfigError
    from evalkit.history import history_entries, load_history

    for target in (args.csv, args.json):
        _check_target(target)
    root = Path(args.reports_dir)
    metric = None
    if args.metric:
        from evalkit.metrics.declarations import MarginKey

        try:
            metric = MarginKey.parse(args.metric)
        except ValueError as e:
            raise ConfigError("--metric", str(e).replace("margin key", "metric")) from None
    entries = history_entries(root)
    df = load_history(root)
    if args.json:
        _write(args.json, json.dumps(entries, indent=2, ensure_ascii=False, default=str))
    if args.csv:
        _write(args.csv, df.to_csv(index=False))
    if "-" in (args.csv, args.json):
        return 0
    if not entries:
        print(f"{root}: no run directories")
        return 0
    for entry in entries:
        if "error" in entry:
            print(f"{entry['name']}: unreadable: {entry['error']}")
    if df.empty:
        print(f"{root}: no scored runs yet")
        return 0
    from evalkit.diff import fmt_figure, text_table
    from evalkit.history import step_changes

    if metric is not None:
        sel = df[(df.suite == metric.suite) & (df.metric == metric.metric)]
        if metric.category is not None:
            sel = sel[sel.category.astype(str) == metric.category]
        else:
            cats = set(sel.category.astype(str))
            pick = "all" if "all" in cats else (next(iter(cats)) if len(cats) == 1 else None)
            sel = sel[sel.category.astype(str) == pick] if pick else sel
        if sel.empty:
            raise ConfigError("--metric", f"{args.metric}: no run under {root} has it")
        rows = [[str(r.run), str(r.deployment), str(r.category), fmt_figure(r.value), f"[{fmt_figure(r.ci_low)}, {fmt_figure(r.ci_high)}]", fmt_figure(r.n),
                 "step" if bool(r.step) else "", str(r.changed)] for r in step_changes(sel).itertuples()]
        print("\n".join(text_table(["run", "deployment", "category", args.metric, "interval", "n", "", "changed since the previous run"], rows)))
        return 0
    def text(x: Any) -> str:
        return "" if x is None or (isinstance(x, float) and x != x) else str(x)

    seen = df.drop_duplicates(["run", "deployment", "suite"])
    rows = [[text(r.run), text(r.deployment), text(r.suite), text(r.engine), text(r.variant) or text(r.precision),
             text(r.changed)] for r in seen.itertuples()]
    print("\n".join(text_table(["run", "deployment", "suite", "engine", "variant/precision", "changed since the previous run"], rows)))
    return 0

