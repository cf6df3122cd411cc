"""One run's item matrix: a row per item, a column per deployment, built once and answered from memory.

Built from the records (read through `RunDir.records` and `parse_record`, so older layouts are upgraded)
and the per-item CSVs scoring wrote (`items/<suite>.csv`: pass/fail, per-item figures and every
other per-item score). Filters, search and sorting run over arrays held here, so a page of a 20,000-item
run is answered without touching the disk; `IndexCache` rebuilds an index only when one of the files it
was built from changes (mtime and size), which also follows a run that is still being written.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from evalkit.records import parse_record
from evalkit.scoring import ITEMS_DIR
from evalkit.store import MANIFEST, RECORDS_DIR, RunDir, atomic_write_bytes, atomic_write_text
from evalkit.suites import SUITES, ViewerSpec, suite_spec
from evalkit.viewer.safety import inside
from evalkit.viewer.textdiff import first_difference, segments

CACHE_FORMAT = 2  # of the saved index (RunIndex.save); a change makes older saves be rebuilt
CELL_CHARS = 600  # matrix cells show this much of an output; the item view shows all of it
PROMPT_CHARS = 300
# Per-item CSV columns that hold text, not scores (everything else numeric is a sortable score).
_TEXT_COLUMNS = {"suite", "item_id", "deployment", "category", "prompt", "output", "reference", "detail",
                 "sandbox_detail", "sandbox_status", "finish_reason", "status", "choice_logprobs", "skipped", "flip",
                 "method", "kind", "gold", "reference_pred", "passkey", "reference_correct", "reference_passed"}
# The per-item CSV column that says pass/fail, first found wins (HumanEval, MMLU/recall, prompt code, QA).
_OK_COLUMNS = ("passed", "correct", "pass", "contains")


@dataclass
class Query:
    suite: str = ""
    category: str = ""
    deployment: str = ""  # restrict differs/flipped/failed to this deployment ("" = any)
    differs: bool = False
    flipped: bool = False
    failed: bool = False
    q: str = ""
    sort: str = ""  # "<deployment>|<suite>:<metric>"
    desc: bool = False
    offset: int = 0
    limit: int = 50


@dataclass
class _Cell:
    text: str
    value: str | None  # what "differs from the reference" compares
    ok: int  # 1 pass, 0 fail, -1 not a pass/fail item
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_ids: np.ndarray | None = None
    output_ids: np.ndarray | None = None


@dataclass
class _Ragged:
    """Token-id lists of every row in one array (a row's ids: values[start:start + length]; start -1: none)."""

    values: np.ndarray
    start: np.ndarray
    length: np.ndarray

    @classmethod
    def of(cls, n: int, rows: list[int], arrays: list[np.ndarray | None]) -> "_Ragged":
        start, length = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
        parts, at = [], 0
        for i, a in zip(rows, arrays):
            if a is not None:
                start[i], length[i] = at, len(a)
                parts.append(a)
                at += len(a)
        values = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)  # token ids
        return cls(values, start, length)

    def get(self, i: int) -> np.ndarray | None:
        return None if self.start[i] < 0 else self.values[self.start[i]: self.start[i] + self.length[i]]


@dataclass
class _Column:
    """One deployment's cells, a slot per row (columns, not objects: a 120,000-cell run stays compact and is
    saved and loaded as a handful of arrays)."""

    has: np.ndarray  # bool
    text: list[str]
    value: list[str | None]
    ok: np.ndarray  # int8: 1 pass, 0 fail, -1 not pass/fail
    extra: list[dict[str, Any] | None]
    prompt_ids: _Ragged
    output_ids: _Ragged

    @classmethod
    def of(cls, n: int, cells: dict[int, _Cell]) -> "_Column":
        rows = sorted(cells)
        has, ok = np.zeros(n, dtype=bool), np.full(n, -1, dtype=np.int8)
        text: list[str] = [""] * n
        value: list[str | None] = [None] * n
        extra: list[dict[str, Any] | None] = [None] * n
        for i in rows:
            c = cells[i]
            has[i], ok[i], text[i], value[i], extra[i] = True, c.ok, c.text, c.value, c.extra
        return cls(has, text, value, ok, extra, _Ragged.of(n, rows, [cells[i].prompt_ids for i in rows]),
                   _Ragged.of(n, rows, [cells[i].output_ids for i in rows]))


def _viewer(suite: str) -> ViewerSpec:
    """How the viewer shows a suite's items (an unregistered suite: its generations, if any)."""
    return suite_spec(suite).viewer if suite in SUITES else ViewerSpec()


def _ids(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.int64)


def _cell_of(rec: Any) -> tuple[_Cell, str]:
    """(cell, prompt text) of one typed record: the suite's own cell (`SuiteSpec.viewer.cell`), else its generated
    text and token ids (getattr throughout: a suite without a generation shows an empty cell)."""
    make = suite_spec(rec.suite).viewer.cell if rec.suite in SUITES else None
    if make is not None:
        c = make(rec)
        return _Cell(c.text, c.value, c.ok, c.extra, _ids(c.prompt_ids), _ids(c.output_ids)), c.prompt
    gen = getattr(rec, "generation", None)  # records.Generation, on every generating suite's record
    text = gen.text if gen is not None else ""
    extra = {"finish_reason": gen.finish_reason if gen else None, "n_output_tokens": gen.n_output_tokens if gen else None}
    reference = getattr(rec, "reference", None)
    if reference is not None:
        extra["reference_text"] = reference
    ids = _ids(getattr(rec, "prompt_token_ids", None)), _ids(gen.output_token_ids if gen else None)
    return _Cell(text, text, -1, extra, *ids), getattr(rec, "prompt", None) or ""


def signature(path: Path) -> tuple:
    """What an index depends on: manifest, records and per-item CSVs, by name, mtime and size."""
    files = [path / MANIFEST, *sorted((path / RECORDS_DIR).glob("*.jsonl")), *sorted((path / ITEMS_DIR).glob("*.csv"))]
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


class RunIndex:
    """Items x deployments of one run, with flags, scores and search text per row."""

    built_at = 0.0  # when the viewer's cache built or loaded it (time.monotonic), and how long that took
    build_s = 0.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.signature = signature(path)
        run = RunDir.open(path)
        manifest = run.manifest()
        self.run_id = str(manifest.get("run_id", path.name))
        self.reference = str(manifest["reference"])
        self.deployments = [str(d) for d in manifest["deployment_order"]]
        listed = manifest.get("deployments")
        sources: dict[str, Any] = listed if isinstance(listed, dict) else {}
        self.sources = {d: (sources.get(d) or {}).get("source") for d in self.deployments}
        self.keys: list[tuple[str, str]] = []
        self.category: list[str] = []
        self.prompt: list[str] = []
        self.row_of: dict[tuple[str, str], int] = {}  # (suite, item id) -> row
        self.cells: dict[str, dict[int, _Cell]] = {d: {} for d in self.deployments}
        self._arrays: dict[tuple[str, int], Any] = {}
        for dep in self.deployments:
            rpath = run.records_path(dep)
            if not inside(path, rpath):
                continue
            where = str(rpath)
            for raw in run.records(dep):
                if raw.get("suite") in SUITES and not suite_spec(raw["suite"]).viewer.items:
                    continue  # not items (cost: measurements per concurrency level): the report shows them
                rec = parse_record({**raw, "deployment": raw.get("deployment") or dep}, where)
                key = (rec.suite, str(rec.item_id))
                i = self.row_of.get(key)
                cell, prompt = _cell_of(rec)
                if i is None:
                    i = self.row_of[key] = len(self.keys)
                    self.keys.append(key)
                    self.category.append(str(rec.category))
                    self.prompt.append(prompt)
                elif dep == self.reference:
                    self.prompt[i] = prompt  # the reference's prompt text names the item
                self.cells[dep][i] = cell
                if cell.prompt_ids is None and _viewer(rec.suite).token_ids is not None and not getattr(rec, "skipped", None):
                    self._arrays[(dep, i)] = rec  # token ids kept out of the record (a side file), read on demand
        n = len(self.keys)
        self.scores: dict[str, np.ndarray] = {}  # "<deployment>|<suite>:<metric>" -> value per row (NaN: none)
        self.metrics: dict[str, list[str]] = {}  # suite -> its per-item metrics
        self._read_item_csvs()
        self._figures()
        self.cols = {d: _Column.of(n, self.cells[d]) for d in self.deployments}
        del self.cells
        self._derive()

    def _derive(self) -> None:
        """Filter arrays and search text, from the columns (after a build, or a load from the disk cache)."""
        n = len(self.keys)
        self._loaded_ids: dict[tuple[str, int], np.ndarray] = {}
        self.suite_of = np.array([k[0] for k in self.keys], dtype=object)
        self.category_arr = np.array(self.category, dtype=object)
        ref = self.cols[self.reference]
        self.differs_by: dict[str, np.ndarray] = {}
        self.flipped_by: dict[str, np.ndarray] = {}
        for d in self.deployments:
            if d == self.reference:
                continue
            mine = self.cols[d]
            self.differs_by[d] = np.array([a is not None and b is not None and a != b
                                           for a, b in zip(mine.value, ref.value)], dtype=bool)
            self.flipped_by[d] = (ref.ok >= 0) & (mine.ok >= 0) & (ref.ok != mine.ok)
        self.failed_by = {d: self.cols[d].ok == 0 for d in self.deployments}
        texts = [self.cols[d].text for d in self.deployments]
        self.search = ["\n".join([self.prompt[i], *(t[i] for t in texts)]).casefold() for i in range(n)]

    def cell(self, dep: str, i: int) -> _Cell | None:
        col = self.cols[dep]
        if not col.has[i]:
            return None
        pids = self._loaded_ids.get((dep, i))
        return _Cell(col.text[i], col.value[i], int(col.ok[i]), col.extra[i] or {},
                     col.prompt_ids.get(i) if pids is None else pids, col.output_ids.get(i))

    # -- building ---------------------------------------------------------------------------------

    def _read_item_csvs(self) -> None:
        for p in sorted((self.path / ITEMS_DIR).glob("*.csv")):
            if not inside(self.path, p) or p.stat().st_size == 0:
                continue
            with p.open(encoding="utf-8-sig", newline="") as f:
                header = next(csv.reader(f), [])
            if "item_id" not in header or "deployment" not in header:
                continue
            wanted = [c for c in header if c not in _TEXT_COLUMNS or c in ("item_id", "deployment", "suite")]
            df = pd.read_csv(p, encoding="utf-8-sig", usecols=wanted, dtype={"item_id": str, "deployment": str})
            suite_col = df["suite"].astype(str) if "suite" in df else pd.Series(p.stem, index=df.index)
            rows = np.array([self.row_of.get((s, i), -1) for s, i in zip(suite_col, df["item_id"].astype(str))])
            keep = rows >= 0
            df, rows = df[keep].copy(), rows[keep]
            metric_cols = []
            for c in df.columns:
                if c in ("suite", "item_id", "deployment"):
                    continue
                values = df[c]
                if values.dtype == bool or values.dtype == object:
                    values = values.map({True: 1.0, False: 0.0, "True": 1.0, "False": 0.0}) if values.dtype != bool else values.astype(float)
                values = pd.to_numeric(values, errors="coerce")
                if values.notna().any():
                    df[c] = values
                    metric_cols.append(c)
            ok_cols = [c for c in _OK_COLUMNS if c in metric_cols]
            for dep, part in df.groupby("deployment"):
                if dep not in self.cells:
                    continue
                idx = rows[df.index.get_indexer(part.index)]
                for c in metric_cols:
                    arr = self.scores.setdefault(f"{dep}|{p.stem}:{c}", np.full(len(self.keys), np.nan))
                    arr[idx] = part[c].to_numpy(dtype=float)
                ok = np.full(len(part), np.nan)
                for c in ok_cols:  # per row, the first pass/fail column it has (code: pass; QA: contains)
                    ok = np.where(np.isnan(ok), part[c].to_numpy(dtype=float), ok)
                cells = self.cells[dep]
                for i, v in zip(idx.tolist(), ok.tolist()):
                    if i in cells and not math.isnan(v):
                        cells[i].ok = int(v > 0)
            self.metrics[p.stem] = metric_cols

    def _figures(self) -> None:
        """A suite whose cells are figures from its per-item CSV (`ViewerSpec.figures`: perplexity chunks): the cell
        is those figures (what differs compares), its value the `value_metric` figure."""
        for dep, cells in self.cells.items():
            for i, cell in cells.items():
                viewer = _viewer(self.keys[i][0])
                if not viewer.figures or cell.text:
                    continue
                suite = self.keys[i][0]
                parts = []
                for metric, label, form in viewer.figures:
                    arr = self.scores.get(f"{dep}|{suite}:{metric}")
                    if arr is not None and not math.isnan(arr[i]):
                        parts.append(f"{label} {form.format(arr[i])}")
                cell.text = " · ".join(parts) or "(not scored yet)"
                value = self.scores.get(f"{dep}|{suite}:{viewer.value_metric}") if viewer.value_metric else None
                cell.value = None if value is None or math.isnan(value[i]) else f"{value[i]:.6g}"

    # -- answering --------------------------------------------------------------------------------

    def facets(self) -> dict[str, Any]:
        suites = sorted(set(self.suite_of.tolist()))
        cats = sorted(set(self.category))
        sorts = sorted(self.scores)
        return {"suites": suites, "categories": cats, "sorts": sorts, "deployments": self.deployments,
                "reference": self.reference, "n_items": len(self.keys)}

    def select(self, query: Query) -> np.ndarray:
        """Row numbers matching `query`, in its order."""
        n = len(self.keys)
        mask = np.ones(n, dtype=bool)
        if query.suite:
            mask &= self.suite_of == query.suite
        if query.category:
            mask &= self.category_arr == query.category
        deps = [query.deployment] if query.deployment in self.differs_by else list(self.differs_by)
        for flag, by in ((query.differs, self.differs_by), (query.flipped, self.flipped_by)):
            if flag:
                any_ = np.zeros(n, dtype=bool)
                for d in deps:
                    any_ |= by[d]
                mask &= any_
        if query.failed:
            fdeps = [query.deployment] if query.deployment in self.failed_by else self.deployments
            any_ = np.zeros(n, dtype=bool)
            for d in fdeps:
                any_ |= self.failed_by[d]
            mask &= any_
        rows = np.flatnonzero(mask)
        needle = query.q.strip().casefold()
        if needle:
            search = self.search
            rows = np.array([i for i in rows.tolist() if needle in search[i]], dtype=np.int64)
        if query.sort in self.scores:
            values = self.scores[query.sort][rows]
            order = np.argsort(-values if query.desc else values, kind="stable")
            nan_last = np.isnan(values[order])
            rows = np.concatenate([rows[order][~nan_last], rows[order][nan_last]])
        return rows

    def page(self, query: Query) -> dict[str, Any]:
        rows = self.select(query)
        limit = max(1, min(int(query.limit), 500))
        offset = max(0, int(query.offset))
        chosen = rows[offset: offset + limit].tolist()
        return {"total": int(len(rows)), "offset": offset, "limit": limit,
                "rows": [self._row_json(i, CELL_CHARS, query.sort) for i in chosen]}

    def _scores_of(self, dep: str, i: int) -> dict[str, float]:
        out = {}
        prefix = f"{dep}|"
        for key, arr in self.scores.items():
            if key.startswith(prefix) and not math.isnan(arr[i]):
                out[key[len(prefix):]] = float(arr[i])
        return out

    def _row_json(self, i: int, chars: int | None, sort: str = "") -> dict[str, Any]:
        suite, item_id = self.keys[i]
        ref = self.cell(self.reference, i)
        ref_text = ref.text if ref is not None else None
        cells: dict[str, Any] = {}
        for d in self.deployments:
            c = self.cell(d, i)
            if c is None:
                cells[d] = None
                continue
            cut = c.text if chars is None else c.text[:chars]
            compare_to = None if d == self.reference or ref_text is None else (ref_text if chars is None else ref_text[:chars])
            cells[d] = {
                "segments": segments(cut, compare_to) if _viewer(suite).word_diff else [(cut, 0)],
                "truncated": chars is not None and len(c.text) > chars,
                "ok": int(c.ok),
                "differs": bool(self.differs_by[d][i]) if d in self.differs_by else False,
                "flipped": bool(self.flipped_by[d][i]) if d in self.flipped_by else False,
            }
            if sort.startswith(f"{d}|"):
                v = self.scores[sort][i]
                cells[d]["sort_value"] = None if math.isnan(v) else float(v)
        prompt = self.prompt[i]
        return {"suite": suite, "item_id": item_id, "category": self.category[i],
                "prompt": prompt if chars is None else prompt[:PROMPT_CHARS], "prompt_truncated":
                chars is not None and len(prompt) > PROMPT_CHARS, "cells": cells}

    def item(self, suite: str, item_id: str) -> dict[str, Any] | None:
        """Everything about one item: prompt, each deployment's whole output with its differences from the
        reference's, its per-item scores, and the token ids (with the first position that differs)."""
        i = self.row_of.get((suite, item_id))
        if i is None:
            return None
        out = self._row_json(i, None)
        for d in self.deployments:
            self._load_arrays(d, i)
        ref = self.cell(self.reference, i)
        for d in self.deployments:
            c = self.cell(d, i)
            if c is None:
                continue
            same_model = self.sources.get(d) is not None and self.sources.get(d) == self.sources.get(self.reference)
            cell = out["cells"][d]
            cell.update({
                "scores": self._scores_of(d, i),
                "extra": {k: v for k, v in c.extra.items() if v is not None},
                "prompt_token_ids": None if c.prompt_ids is None else c.prompt_ids.tolist(),
                "output_token_ids": None if c.output_ids is None else c.output_ids.tolist(),
                "same_source_as_reference": same_model,
            })
            if ref is not None and d != self.reference:
                cell["prompt_ids_first_difference"] = first_difference(
                    None if c.prompt_ids is None else c.prompt_ids.tolist(),
                    None if ref.prompt_ids is None else ref.prompt_ids.tolist())
                cell["output_ids_first_difference"] = first_difference(
                    None if c.output_ids is None else c.output_ids.tolist(),
                    None if ref.output_ids is None else ref.output_ids.tolist())
        self._add_judgements(out, suite, item_id)
        out["reference"] = self.reference
        out["deployments"] = self.deployments
        return out

    def _add_judgements(self, out: dict[str, Any], suite: str, item_id: str) -> None:
        """A model judge's answers on this item (evalkit.judge), per deployment: score or verdict, and its reason
        and raw answer as text (model output: the page shows it inert, as every output)."""
        from evalkit.judge.score import load_judgements
        from evalkit.suites import rated_suite

        if suite != rated_suite():  # the judge grades the rated suite's outputs (SuiteSpec.rated_outputs)
            return
        _, recs = load_judgements(self.path)
        for r in recs:
            cell = out["cells"].get(r.get("deployment")) if r.get("item_id") == item_id else None
            if cell is None:
                continue
            cell.setdefault("judge", []).append({k: r.get(k) for k in ("mode", "pass", "order", "score", "verdict", "outcome",
                                                                      "parsed", "problem", "reason", "raw")})


    def _load_arrays(self, dep: str, i: int) -> None:
        """The token ids of a record that keeps them out of the record (`ViewerSpec.token_ids`: a perplexity
        chunk's side file, records v2)."""
        rec = self._arrays.get((dep, i))
        if rec is None or (dep, i) in self._loaded_ids:
            return
        reader = _viewer(rec.suite).token_ids
        if reader is None:
            return
        try:
            ids = reader(rec, self.path)
        except Exception:  # a missing side file leaves the ids unshown, the rest of the item stays
            return
        if ids is not None:
            self._loaded_ids[(dep, i)] = np.asarray(ids, dtype=np.int64)


    # -- the disk cache ---------------------------------------------------------------------------

    def save(self, files: tuple[Path, Path] | None = None) -> None:
        """Keep this index in evalkit's cache dir (never in the run directory), for the next viewer start.

        Arrays go to an .npz (no pickle), text to a .json; both carry one stamp, so a pair written by two
        viewers at once is never mixed on load."""
        meta_path, arrays_path = files or cache_files(self.path)
        stamp = secrets.token_hex(8)
        arrays: dict[str, np.ndarray] = {"stamp": np.frombuffer(stamp.encode(), dtype=np.uint8)}
        for k, d in enumerate(self.deployments):
            c = self.cols[d]
            arrays.update({f"c{k}_has": c.has, f"c{k}_ok": c.ok,
                           f"c{k}_pv": c.prompt_ids.values, f"c{k}_ps": c.prompt_ids.start, f"c{k}_pl": c.prompt_ids.length,
                           f"c{k}_ov": c.output_ids.values, f"c{k}_os": c.output_ids.start, f"c{k}_ol": c.output_ids.length})
        score_keys = list(self.scores)
        arrays.update({f"s{j}": self.scores[key] for j, key in enumerate(score_keys)})
        meta = {
            "format": CACHE_FORMAT, "stamp": stamp, "path": str(self.path), "signature": [list(x) for x in self.signature],
            "run_id": self.run_id, "reference": self.reference, "deployments": self.deployments, "sources": self.sources,
            "keys": [list(k) for k in self.keys], "category": self.category, "prompt": self.prompt, "metrics": self.metrics,
            "score_keys": score_keys,
            "cols": {d: {"text": c.text, "value": c.value, "extra": c.extra} for d, c in self.cols.items()},
            "arrays": [[d, i, rec.model_dump(mode="json")] for (d, i), rec in self._arrays.items()],
        }
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=True, **arrays)  # numpy's default, spelled out so the arrays are the only **kwds
        atomic_write_bytes(arrays_path, buf.getvalue())
        atomic_write_text(meta_path, json.dumps(meta, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path, files: tuple[Path, Path] | None = None) -> "RunIndex | None":
        """The saved index of `path` when it was built from exactly the files there now, else None."""
        meta_path, arrays_path = files or cache_files(path)
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("format") != CACHE_FORMAT or meta.get("path") != str(path):
                return None
            if tuple(tuple(x) for x in meta["signature"]) != signature(path):
                return None
            with np.load(arrays_path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if arrays.get("stamp", np.zeros(0, np.uint8)).tobytes().decode(errors="replace") != meta.get("stamp"):
            return None
        self = cls.__new__(cls)
        self.path, self.signature = path, signature(path)
        self.run_id, self.reference, self.deployments = meta["run_id"], meta["reference"], meta["deployments"]
        self.sources, self.category, self.prompt, self.metrics = meta["sources"], meta["category"], meta["prompt"], meta["metrics"]
        self.keys = [(k[0], k[1]) for k in meta["keys"]]
        self.row_of = {k: i for i, k in enumerate(self.keys)}
        self.scores = {key: arrays[f"s{j}"] for j, key in enumerate(meta["score_keys"])}
        self.cols = {}
        for k, d in enumerate(self.deployments):
            m = meta["cols"][d]
            self.cols[d] = _Column(arrays[f"c{k}_has"], m["text"], m["value"], arrays[f"c{k}_ok"], m["extra"],
                                   _Ragged(arrays[f"c{k}_pv"], arrays[f"c{k}_ps"], arrays[f"c{k}_pl"]),
                                   _Ragged(arrays[f"c{k}_ov"], arrays[f"c{k}_os"], arrays[f"c{k}_ol"]))
        self._arrays = {(d, int(i)): parse_record(raw) for d, i, raw in meta["arrays"]}
        self._derive()
        return self


def cache_files(path: Path) -> tuple[Path, Path]:
    from evalkit.models import cache_dir

    stem = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:32]
    folder = cache_dir() / "viewer"
    return folder / f"{stem}.json", folder / f"{stem}.npz"


def _save_quietly(index: RunIndex) -> None:
    try:
        index.save()
    except OSError:  # a read-only or full cache dir costs the next start a rebuild, nothing else
        pass


class IndexCache:
    """One index per run directory, rebuilt when the files it was built from change; the `keep` most
    recently used are held (a big run's index is a few hundred MB)."""

    def __init__(self, keep: int = 4, disk: bool = True) -> None:
        self.keep = keep
        self.disk = disk
        self._lock = threading.Lock()
        self._locks: dict[Path, threading.Lock] = {}
        self._indexes: OrderedDict[Path, RunIndex] = OrderedDict()

    def get(self, path: Path) -> RunIndex:
        with self._lock:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:  # one build per run at a time; a second request waits for it instead of building again
            index = self._indexes.get(path)
            if index is None or (index.signature != signature(path) and not self._fresh_enough(index)):
                t = time.monotonic()
                index = RunIndex.load(path) if self.disk else None
                if index is None:
                    index = RunIndex(path)
                    if self.disk:  # written after answering: the next viewer start finds it built
                        threading.Thread(target=_save_quietly, args=(index,), daemon=True).start()
                index.built_at, index.build_s = time.monotonic(), time.monotonic() - t
            with self._lock:
                self._indexes[path] = index
                self._indexes.move_to_end(path)
                while len(self._indexes) > self.keep:
                    self._indexes.popitem(last=False)
            return index

    @staticmethod
    def _fresh_enough(index: RunIndex) -> bool:
        """A run still being written changes with every batch: its index is rebuilt at most every few build
        times (at least 5 s), not on every request."""
        age = time.monotonic() - index.built_at
        return age < max(5.0, 3 * index.build_s)

    def warm(self, paths: Iterable[Path]) -> None:
        for p in paths:
            try:
                self.get(p)
            except Exception:  # warming is a courtesy; the request will report the error
                pass
