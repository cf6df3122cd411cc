"""A history of runs: what each (deployment, suite) result depends on, and every run's scores in one frame.

**Comparability keys.** From a run's manifest (model hashes, engine versions, resolved config, data files),
each (deployment, suite) result gets a flat key of what it depends on: the engine and the version that ran,
the weights' sha256, the variant recipe, the precision and device the hardware really computed with, every
engine option (marked by whether the engine declares it can change a result, `EngineSpec.numerics_options`),
the suite's data hashes and settings, sampling (for suites that generate), the statistics settings, evalkit's
version and the machine. Two results are comparable when their keys agree except in what is being compared;
`key_changes` lists the fields that differ, each with its kind:

- `items`: the suite's data or a setting that defines its items (a data file's hash, MMLU's shots, ...):
  the same item id may not be the same item, so the two results are **not comparable**;
- `size`: a setting that only chooses how many items run (limits, chunk counts): items pair by id;
- `metrics`: a suite setting that leaves the items as they are but can change some of its metrics (the suite
  declares which: `SuiteSpec.metric_settings`, e.g. perplexity's top_k changes the KLD figures, not the
  perplexity): comparable, except in those metrics;
- `cause`: what can change a result (weights, variant, engine and version, precision, numerics options,
  sampling) — what a difference between the runs is attributed to;
- `setting`: an engine option its engine declares does not change results (llama.cpp's thread count);
- `stats`: interval settings (the newer run's are used); `environment`: evalkit's version, the machine;
  `location`: a data path that moved while its content hash stayed the same.

**History index.** `history_entries(reports_dir)` reads every run directory once and keeps what it read in
`<reports_dir>/.evalkit-history.json` (a cache: stamped by the files it was read from, written atomically
under a lock, its body checked by its sha256; a damaged, cut or stale index is rebuilt from the run
directories, never trusted and never an error). `load_history` is the notebook API: one tidy DataFrame.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable

from evalkit.errors import RunDirError
from evalkit.fileio import atomic_write_bytes
from evalkit.store import COMPARISONS_CSV, MANIFEST, RECORDS_DIR, SCORES_CSV, RunDir, read_keys

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
INDEX_FILE = ".evalkit-history.json"
INDEX_FORMAT = 1
_MAGIC = b"evalkit-history"

# Settings that only choose how many items run (a bigger run shares its first items with a smaller one): the
# viewer's run-against-run rule (evalkit.viewer.compare.SIZE_SETTINGS) and this one agree.
SIZE_SETTINGS = frozenset({"limit", "limit_per_category", "max_chunks", "per_subject", "lengths", "depths", "categories",
                           "subjects", "repeats", "concurrency"})
PATH_SETTINGS = frozenset({"path", "text"})  # where a suite's data lies: its content is keyed by hash
KINDS = ("items", "size", "metrics", "cause", "setting", "stats", "environment", "location")
KEY_COLUMNS = ("engine", "engine_version", "weights_sha256", "model_source", "variant", "precision", "device")


def _canon(value: Any) -> str:
    """One string per value, equal exactly when the values are (JSON, keys sorted)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _generates(suite: str) -> bool:
    """Whether `suite` generates text (so sampling settings change its results)."""
    try:
        from evalkit.engines.spec import Capability
        from evalkit.suites import suite_class

        return Capability.GENERATE in getattr(suite_class(suite), "requires", frozenset())
    except Exception:  # an unknown suite of another evalkit: sampling counts, to be safe
        return True


def _numerics_options(engine: str) -> frozenset[str] | None:
    try:
        from evalkit.engines import engine_spec

        return frozenset(engine_spec(engine).numerics_options)
    except Exception:  # an engine this installation does not know: every option counts
        return None


def _engine_version(run: Path, dep: str, engine: str, libraries: dict[str, Any]) -> str | None:
    """The engine library's version that ran (engines/<dep>.json), else the manifest's library versions."""
    described = run / "engines" / f"{dep}.json"
    try:
        version = json.loads(described.read_text(encoding="utf-8")).get("engine_version")
        if version:
            return str(version)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        from evalkit.engines import engine_spec

        for package in engine_spec(engine).package:
            if libraries.get(package):
                return str(libraries[package])
    except Exception:
        pass
    return None


def _data_fields(described: Any) -> dict[str, Any]:
    """The content hashes a suite's manifest entry records (text_sha256, data_sha256, files, ...)."""
    out: dict[str, Any] = {}
    if not isinstance(described, dict):
        return out
    for k, v in described.items():
        if "sha256" in k or k in ("files", "dataset"):
            out[k] = v
    return out


def result_keys(run: Path, manifest: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, str]]]:
    """deployment -> suite -> {field: canonical value} for every (deployment, suite) the run planned."""
    manifest = manifest if manifest is not None else RunDir.open(run).manifest()
    config = manifest.get("config") or {}
    env = manifest.get("environment") or {}
    libraries = env.get("libraries") or {}
    machine = env.get("machine") or {}
    accelerators = [a.get("name", a) if isinstance(a, dict) else a for a in env.get("accelerators") or []]
    described_suites = manifest.get("suites") or {}
    skipped = {(s.get("deployment"), s.get("suite")) for s in manifest.get("skipped") or [] if isinstance(s, dict)}
    suites = {name: s for name, s in (config.get("suites") or {}).items() if isinstance(s, dict)}
    entries = manifest.get("deployments") or {}
    out: dict[str, dict[str, dict[str, str]]] = {}
    for dep_conf in config.get("deployments") or []:
        dep = str(dep_conf.get("name"))
        entry = entries.get(dep) or {}
        engine = str(dep_conf.get("engine") or entry.get("engine") or "")
        hardware = entry.get("hardware") or {}
        model = dep_conf.get("model") or {}
        base: dict[str, Any] = {
            "engine": engine,
            "engine_version": _engine_version(run, dep, engine, libraries),
            "weights_sha256": entry.get("sha256") or (entry.get("endpoint") and f"served at {entry.get('endpoint')}"),
            "model_source": model.get("source") if isinstance(model, dict) else model,
            "variant": model.get("variant") if isinstance(model, dict) else None,
            "precision": hardware.get("effective_precision"),
            "device": hardware.get("device"),
            "stats": config.get("stats"),
            "evalkit_version": manifest.get("evalkit_version"),
            "machine.cpu": machine.get("cpu"),
            "machine.accelerators": accelerators,
        }
        for k, v in sorted((dep_conf.get("options") or {}).items()):
            base[f"option.{k}"] = v
        wanted = dep_conf.get("suites")
        per: dict[str, dict[str, str]] = {}
        for suite, settings in suites.items():
            if (wanted is not None and suite not in wanted) or (dep, suite) in skipped:
                continue
            key = dict(base)
            for k, v in sorted(settings.items()):
                key[f"suite.{k}"] = v
            for k, v in sorted(_data_fields(described_suites.get(suite)).items()):
                key[f"data.{k}"] = v
            if _generates(suite):
                for k, v in sorted((config.get("sampling") or {}).items()):
                    key[f"sampling.{k}"] = v
            per[suite] = {k: _canon(v) for k, v in key.items()}
        out[dep] = per
    return out


def _metric_settings(suite: str | None) -> dict[str, frozenset[str]]:
    """The suite's settings that change only some metrics (SuiteSpec.metric_settings); {} for an unknown suite."""
    if not suite:
        return {}
    try:
        from evalkit.suites import suite_spec

        return dict(suite_spec(suite).metric_settings)
    except Exception:  # a suite this installation does not know: every setting defines its items, to be safe
        return {}


def field_kind(field: str, engine: str | None = None, key: dict[str, str] | None = None, suite: str | None = None) -> str:
    """The kind of a key field (see the module doc); `key` tells a moved data path from changed data; `suite`
    (the key's suite) tells a setting that changes only some metrics from one that defines the items."""
    if field.startswith("data."):
        return "items"
    if field.startswith("suite."):
        name = field.split(".", 1)[1]
        if name in SIZE_SETTINGS:
            return "size"
        if name in _metric_settings(suite):
            return "metrics"
        if name in PATH_SETTINGS and key is not None and any(k.startswith("data.") for k in key):
            return "location"  # the content is keyed by hash: a moved file with the same bytes is the same data
        return "items"
    if field.startswith("option."):
        numerics = _numerics_options(engine or "")
        return "cause" if numerics is None or field.split(".", 1)[1] in numerics else "setting"
    if field == "stats":
        return "stats"
    if field in ("evalkit_version", "machine.cpu", "machine.accelerators"):
        return "environment"
    return "cause"


def key_changes(before: dict[str, str], after: dict[str, str], suite: str | None = None) -> list[dict[str, Any]]:
    """Fields whose values differ between two keys of `suite`'s results: [{field, kind, before, after}] (values as
    JSON text; a field only one key has reads "absent" on the other side); a `metrics` change also lists the
    metrics it can change (`metrics`). Without `suite`, every suite setting that is not a size defines the items."""
    engine = json.loads(after.get("engine") or before.get("engine") or '""')
    scoped = _metric_settings(suite)
    out = []
    for f in sorted(set(before) | set(after)):
        a, b = before.get(f), after.get(f)
        if {a, b} <= {None, "null"}:
            continue  # a setting one evalkit records and the other does not, left at its default (null) where recorded
        if a != b:
            change: dict[str, Any] = {"field": f, "kind": field_kind(f, engine, after if f in after else before, suite),
                      "before": "absent" if a is None else a, "after": "absent" if b is None else b}
            if change["kind"] == "metrics":
                change["metrics"] = sorted(scoped[f.split(".", 1)[1]])
            out.append(change)
    return out


def unpaired_metrics(changes: Iterable[dict[str, Any]]) -> set[str]:
    """The metrics that `metrics` changes make incomparable (the rest of the suite's stay comparable)."""
    return {m for c in changes if c["kind"] == "metrics" for m in c.get("metrics", [])}


def blocking(changes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes that make two results not comparable (their items differ)."""
    return [c for c in changes if c["kind"] == "items"]


def describe_change(c: dict[str, Any], width: int = 24) -> str:
    """`field: before -> after`, long values (hashes) shortened."""
    def short(v: str) -> str:
        v = v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v
        v = _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", v)  # a terminal escape in a run's manifest stays text
        return v if len(v) <= width else v[: width - 1] + "…"

    return f"{c['field']}: {short(c['before'])} -> {short(c['after'])}"


def item_sets(run: Path, manifest: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """deployment -> suite -> {n, sha256}: the recorded item ids (line heads only) and a hash of their sorted set."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for dep in manifest.get("deployment_order") or []:
        path = run / RECORDS_DIR / f"{dep}.jsonl"
        by_suite: dict[str, set[str]] = {}
        try:
            for key in read_keys(path):
                suite, _, item = key.partition("/")
                by_suite.setdefault(suite, set()).add(item)
        except (RunDirError, OSError):
            continue
        out[str(dep)] = {s: {"n": len(ids), "sha256": hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()}
                         for s, ids in sorted(by_suite.items())}
    return out


# -- the index ----------------------------------------------------------------------------------------------


def _stamp(run: Path) -> list[Any]:
    """What an entry was read from: (name, mtime_ns, size) of the manifest, tables and records files."""
    paths = [run / MANIFEST, run / SCORES_CSV, run / COMPARISONS_CSV]
    try:
        paths += sorted((run / RECORDS_DIR).glob("*.jsonl"))
    except OSError:
        pass
    out: list[Any] = []
    for p in paths:
        try:
            st = p.stat()
            out.append([p.name, st.st_mtime_ns, st.st_size])
        except OSError:
            out.append([p.name, None, None])
    return out


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _scores(run: Path) -> list[dict[str, Any]]:
    import csv

    path = run / SCORES_CSV
    if not path.is_file():
        return []
    rows = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = {"deployment": r.get("deployment"), "suite": r.get("suite"), "category": r.get("category"),
                                   "metric": r.get("metric")}
            for k in ("value", "ci_low", "ci_high", "n"):
                try:
                    row[k] = _finite(float(r[k])) if r.get(k) not in (None, "") else None
                except ValueError:
                    row[k] = None
            rows.append(row)
    return rows


def read_entry(run: Path) -> dict[str, Any]:
    """What the history keeps of one run directory (RunDirError when it is not one)."""
    rd = RunDir.open(run)
    manifest = rd.manifest()
    if not isinstance(manifest, dict) or "config" not in manifest:
        raise RunDirError(str(rd.manifest_path), "not an evalkit manifest (no config)")
    return {
        "name": run.name,
        "run_id": manifest.get("run_id") or run.name,
        "created": manifest.get("created"),
        "reference": manifest.get("reference"),
        "deployments": [str(d) for d in manifest.get("deployment_order") or []],
        "scored": (run / SCORES_CSV).is_file(),
        "keys": result_keys(run, manifest),
        "items": item_sets(run, manifest),
        "scores": _scores(run),
    }


def encode_index(entries: dict[str, dict[str, Any]]) -> bytes:
    """The index file's bytes: a header line (magic, format, sha256 of the body), then the JSON body."""
    body = json.dumps({"format": INDEX_FORMAT, "runs": entries}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")
    return _MAGIC + b" %d %s\n" % (INDEX_FORMAT, hashlib.sha256(body).hexdigest().encode("ascii")) + body


def decode_index(data: bytes) -> dict[str, dict[str, Any]] | None:
    """The runs of an index file's bytes, or None when they are not a whole index of this format (cut, damaged,
    another format): the caller then reads the run directories again."""
    head, sep, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 3 or parts[0] != _MAGIC or parts[1] != str(INDEX_FORMAT).encode():
        return None
    if hashlib.sha256(body).hexdigest().encode("ascii") != parts[2]:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    return runs if isinstance(runs, dict) else None


def run_dirs(reports_dir: Path) -> list[Path]:
    """The run directories directly under `reports_dir` (real directories holding a manifest), by name."""
    try:
        children = sorted(reports_dir.iterdir())
    except OSError as e:
        raise RunDirError(str(reports_dir), f"cannot list the reports folder ({e.strerror or e})") from None
    return [c for c in children if not c.is_symlink() and c.is_dir() and (c / MANIFEST).is_file()]


def history_entries(reports_dir: Path, *, write_index: bool = True, memory: dict[str, Any] | None = None,
                    unsaved: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every run under `reports_dir` (oldest first, by creation time then name), from the index where it is
    current, else read again; the index is then brought up to date (atomically, under its lock). A run directory
    that cannot be read is kept with its problem in the entry's `error`. `memory` (a dict the caller keeps):
    entries are kept there instead of in the index file, and nothing is written (the viewer's way). `unsaved` (a
    dict the caller keeps): the index is read but not written; where it is out of date, its new content is left
    there for the caller to `save_index` once its command has succeeded (`evalkit diff --baseline`: a command that
    ends in exit 2 writes nothing)."""
    reports_dir = Path(reports_dir)
    if not reports_dir.is_dir():
        raise RunDirError(str(reports_dir), "no such reports folder")
    index_path = reports_dir / INDEX_FILE
    if memory is not None:
        kept = dict(memory)
        write_index = False
    else:
        try:
            kept = decode_index(index_path.read_bytes()) or {}
        except OSError:
            kept = {}
    entries: dict[str, dict[str, Any]] = {}
    changed = False
    for run in run_dirs(reports_dir):
        stamp = _stamp(run)
        old = kept.get(run.name)
        if isinstance(old, dict) and old.get("stamp") == stamp and isinstance(old.get("entry"), dict):
            entries[run.name] = old
            continue
        try:
            entry = read_entry(run)
        except RunDirError as e:
            entry = {"name": run.name, "error": str(e)}
        entries[run.name] = {"stamp": stamp, "entry": entry}
        changed = True
    changed = changed or set(kept) != set(entries)
    if memory is not None:
        memory.clear()
        memory.update(entries)
    if changed and unsaved is not None:
        unsaved.clear()
        unsaved.update(entries)
    elif changed and write_index:
        save_index(reports_dir, entries)
    out = [v["entry"] for v in entries.values()]
    return sorted(out, key=lambda e: (str(e.get("created") or ""), e["name"]))


def save_index(reports_dir: Path, entries: dict[str, Any]) -> None:
    """Write the index of `reports_dir` (run name -> {stamp, entry}, as history_entries reads it)."""
    from filelock import FileLock, Timeout

    try:
        with FileLock(Path(reports_dir) / f".{INDEX_FILE}.lock", timeout=30):
            # One writer at a time, each writing a whole index of the folder as it just read it: the file is
            # always some writer's complete view, and an entry is only ever used where its stamp still holds.
            # Under the lock no writer is mid-write, so a temporary left beside it is a dead writer's: swept.
            for orphan in Path(reports_dir).glob(f".{INDEX_FILE}.*.tmp"):
                orphan.unlink(missing_ok=True)
            atomic_write_bytes(Path(reports_dir) / INDEX_FILE, encode_index(entries))
    except (OSError, Timeout):
        pass  # a read-only folder or a stuck lock: the history is still right, only not kept for next time


def load_history(reports_dir: str | Path, *, write_index: bool = True, memory: dict[str, Any] | None = None) -> Any:
    """One tidy DataFrame of every run's scores under `reports_dir`, oldest run first, with each row's
    comparability key: run, run_id, created, deployment, suite, category, metric, value, ci_low, ci_high, n,
    key (a short hash of the whole key), the key's main fields (engine, engine_version, weights_sha256,
    model_source, variant, precision, device), and `changed`: what differs from the same deployment and suite
    in the previous run that has it ('' for its first run; 'nothing' when the keys agree; 'not comparable: ...'
    when the items differ) and `change_group`, what that change is about (CHANGE_GROUPS: weights, engine, ...)."""
    import pandas as pd

    rows = []
    previous: dict[tuple[str, str], dict[str, str]] = {}
    for e in history_entries(Path(reports_dir), write_index=write_index, memory=memory):
        if "error" in e:
            continue
        keys = e.get("keys") or {}
        changed_of: dict[tuple[str, str], tuple[str, str]] = {}
        unpaired_of: dict[tuple[str, str], tuple[set[str], list[dict[str, Any]]]] = {}
        for dep, per in keys.items():
            for suite, key in per.items():
                before = previous.get((dep, suite))
                if before is None:
                    changed_of[(dep, suite)] = ("", "first run")
                else:
                    changes = key_changes(before, key, suite)
                    changed_of[(dep, suite)] = (summarize_changes(changes), change_group(changes))
                    unpaired_of[(dep, suite)] = (unpaired_metrics(changes), changes)
                previous[(dep, suite)] = key
        for s in e.get("scores") or []:
            key = keys.get(s["deployment"], {}).get(s["suite"], {})
            changed, group = changed_of.get((s["deployment"], s["suite"]), ("", ""))[0], \
                changed_of.get((s["deployment"], s["suite"]), ("", "first run"))[1]
            unpaired, changes = unpaired_of.get((s["deployment"], s["suite"]), (set(), []))
            if s.get("metric") in unpaired:  # this metric's setting changed: not comparable with the previous run
                changed, group = "not comparable: " + "; ".join(describe_change(c) for c in changes
                                                                if s["metric"] in c.get("metrics", [])), "not comparable"
            row = {"run": e["name"], "run_id": e["run_id"], "created": e.get("created"), **s,
                   "key": hashlib.sha256(_canon(key).encode()).hexdigest()[:12] if key else None,
                   "changed": changed, "change_group": group}
            for col in KEY_COLUMNS:
                row[col] = json.loads(key[col]) if col in key else None
            rows.append(row)
    columns = ["run", "run_id", "created", "deployment", "suite", "category", "metric", "value", "ci_low", "ci_high",
               "n", "key", *KEY_COLUMNS, "changed", "change_group"]
    df = pd.DataFrame(rows, columns=columns)
    if not df.empty:
        df["created"] = pd.to_datetime(df["created"], utc=True, errors="coerce")
    return df


def summarize_changes(changes: list[dict[str, Any]]) -> str:
    """One phrase: 'nothing', 'not comparable: <items fields>', or the differing fields (causes first)."""
    if not changes:
        return "nothing"
    bad = blocking(changes)
    if bad:
        return "not comparable: " + "; ".join(describe_change(c) for c in bad)
    order = {k: i for i, k in enumerate(KINDS)}
    shown = sorted((c for c in changes if c["kind"] not in ("environment", "location")), key=lambda c: (order[c["kind"]], c["field"]))
    if not shown:
        return "environment only: " + "; ".join(describe_change(c) for c in changes)
    def note(c: dict[str, Any]) -> str:
        if c["kind"] == "setting":
            return " (its engine declares it changes no result)"
        if c["kind"] == "metrics":
            ms = c.get("metrics") or []
            return (f" (changes only {', '.join(ms[:3])}{f' and {len(ms) - 3} more' if len(ms) > 3 else ''}: those are not compared)"
                    if ms else " (its suite declares it changes no result)")
        return ""

    return "; ".join(describe_change(c) + note(c) for c in shown)


def index_path(reports_dir: Path) -> Path:
    return Path(reports_dir) / INDEX_FILE


# -- trends -------------------------------------------------------------------------------------------------

# What a change is about, for the trends page's colours: the first group a run's changed fields fall in.
CHANGE_GROUPS = ("first run", "nothing", "not comparable", "weights", "engine", "options", "sampling", "settings only",
                 "environment only")


def change_group(changes: list[dict[str, Any]]) -> str:
    """What a list of key changes is about (the first of CHANGE_GROUPS that applies, from "nothing")."""
    if not changes:
        return "nothing"
    fields = {c["field"] for c in changes}
    kinds = {c["kind"] for c in changes}
    if "items" in kinds:
        return "not comparable"
    if fields & {"weights_sha256", "variant", "model_source", "precision"}:
        return "weights"
    if fields & {"engine", "engine_version", "device"}:
        return "engine"
    if any(c["field"].startswith("option.") and c["kind"] == "cause" for c in changes):
        return "options"
    if any(f.startswith("sampling.") for f in fields):
        return "sampling"
    if kinds & {"setting", "size", "metrics", "stats"}:
        return "settings only"
    return "environment only"


def step_changes(df: Any) -> Any:
    """`df` (load_history's rows) with a `step` column: True where a value's (1 - alpha) interval does not
    overlap the interval of the same deployment, suite, category and metric in the previous run that has it
    (a conservative flag: overlapping intervals can still differ under a paired test, which `evalkit diff` runs)."""
    df = df.copy()
    df["step"] = False
    if df.empty:
        return df
    order = df.sort_values(["created", "run"], kind="stable")
    for _, g in order.groupby(["deployment", "suite", "category", "metric"], sort=False):
        prev = None
        for idx, r in g.iterrows():
            lo, hi = r["ci_low"], r["ci_high"]
            ok = all(x is not None and isinstance(x, (int, float)) and math.isfinite(float(x)) for x in (lo, hi))
            if prev is not None and ok and (float(lo) > prev[1] or float(hi) < prev[0]):
                df.at[idx, "step"] = True
            if ok:
                prev = (float(lo), float(hi))
    return df


def trend(reports_dir: Path, suite: str = "", metric: str = "", category: str = "", *,
          memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """A metric over the runs of `reports_dir`, per deployment (the viewer's trends page): every point with its
    interval, what changed since the deployment's previous run (`changed`, `group`) and whether it is a step.
    Without a metric: the first that has values in most runs. `metrics` lists every choice. With `memory`, nothing
    is written (entries kept in that dict)."""
    df = load_history(reports_dir, write_index=memory is None, memory=memory)
    choices = sorted({(str(s), str(m)) for s, m in zip(df["suite"], df["metric"])}) if not df.empty else []
    out: dict[str, Any] = {"metrics": [{"suite": s, "metric": m} for s, m in choices], "suite": suite, "metric": metric,
                           "category": category, "categories": [], "series": [], "runs": [], "groups": list(CHANGE_GROUPS)}
    if df.empty:
        return out
    if (suite, metric) not in choices:
        counts = df.groupby(["suite", "metric"])["run"].nunique().sort_values(ascending=False, kind="stable")
        preferred = [k for k in counts.index if k[1] in ("ppl_ratio", "accuracy", "exact_match", "pass@1")]
        suite, metric = (preferred or list(counts.index))[0]
    sel = df[(df.suite == suite) & (df.metric == metric)]
    cats = sorted(set(sel.category.astype(str)))
    if category not in cats:
        category = "all" if "all" in cats else cats[0]
    sel = step_changes(sel[sel.category.astype(str) == category])
    from evalkit.metrics.declarations import direction_of

    out.update({"suite": suite, "metric": metric, "category": category, "categories": cats,
                "direction": direction_of(suite, metric) or "none",
                "runs": [{"run": r, "created": str(c)} for r, c in sel.drop_duplicates("run")[["run", "created"]].itertuples(index=False)]})
    for dep, g in sel.groupby("deployment", sort=False):
        points = []
        for r in g.itertuples():
            points.append({"run": r.run, "run_id": r.run_id, "created": None if r.created is None else str(r.created),
                           "value": _finite(r.value), "ci_low": _finite(r.ci_low), "ci_high": _finite(r.ci_high),
                           "n": _finite(r.n), "changed": r.changed, "group": r.change_group,
                           "step": bool(r.step)})
        out["series"].append({"deployment": str(dep), "points": points})
    return out
