"""Long context: does a deployment start repeating itself, or forget, as the context grows?

For each target length L (total prompt tokens, BOS included, cut with the deployment's own tokenizer):
- repetition ("rep/L<L>"): the filler text cut to L tokens, continued for `continuation_tokens` tokens;
  seq-rep-2/3/4 and distinct-2 over whitespace words of the continuation (tokenizer-independent).
- recall ("recall/L<L>/D<depth>"): a 5-digit pass key sentence inserted at each depth of the filler,
  then "What is the pass key? The pass key is"; correct if the continuation contains the number.
- tasks beyond one needle (`tasks`: multikey, multivalue, vartrack, commonwords; "<task>/L<L>/S<sample>"),
  after RULER's families (evalkit.suites.longtasks): prompt + answer budget = L tokens exactly; correct when
  every answer appears in the continuation. Per task: accuracy by length, paired flips against the reference,
  and the effective length (the longest length whose accuracy is at or above `effective_threshold`).
Lengths that do not fit the engine's context (n_ctx minus the tokens to generate) are emitted as
skipped records with the reason, so resume treats them as done and reports can say why they are missing.
"""
from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Sequence

import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from evalkit.config import PositiveInt, Seed, resolve_data_path
from evalkit.engines.base import Engine, GenRequest, SamplingParams
from evalkit.errors import DataError
from evalkit.metrics.repetition import distinct_n, seq_rep_n, words
from evalkit.metrics.stats import StatsSettings
from evalkit.metrics.compare import Compared, continuous_row, pass_fail_rows, pass_fail_scores
from evalkit.metrics.declarations import MetricSpec
from evalkit.records import Generation, Record, dump_record, nested_generation, provenance, typed
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites import longtasks
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords, paired_with_reference
from evalkit.suites.spec import ItemCell, SuiteSpec, ViewerSpec



class LongContextSettings(BaseModel):
    """`suites.longcontext`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lengths: list[PositiveInt] = Field(default=[1024, 2048, 4096, 8192], min_length=1)
    depths: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(default=[0.1, 0.5, 0.9], min_length=1)
    continuation_tokens: PositiveInt = 128
    seed: Seed = 0
    filler: str = Field(default="texts/longcontext_filler.txt", min_length=1)
    tasks: list[Literal["multikey", "multivalue", "vartrack", "commonwords"]] = []  # RULER-style tasks (none: pass key only)
    task_samples: PositiveInt = 4  # items per task and length
    effective_threshold: float = Field(default=0.85, gt=0, le=1)  # RULER's: Llama-2-7B's 4K score, 85.6%


class LongContextRecord(Record):
    """A repetition or recall item; `skipped` (with the reason) when its length does not fit."""

    suite: Literal["longcontext"] = "longcontext"
    kind: Literal["rep", "recall", "multikey", "multivalue", "vartrack", "commonwords"]
    length_target: int
    depth: float | None = None
    passkey: str | None = None
    n_ctx: int | None = None  # absent from records written before it was recorded
    filler_repeats: int
    skipped: str | None = None
    needle_token_pos: int | None = None
    depth_actual: float | None = None
    n_prompt_tokens: int | None = None
    prompt_sha256: str | None = None
    generation: Generation | None = None  # None: skipped
    correct: bool | None = None  # recall and task items
    sample: int | None = None  # task items: which of task_samples
    answers: list[str] | None = None  # task items: what the continuation must hold
    answers_found: list[bool] | None = None
    needle_positions: list[int] | None = None  # task items: token index of each needle (commonwords: the list)

    @classmethod
    def from_v2(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return nested_generation(raw)

    @property
    def output(self) -> str:
        """The continuation ("" for a skipped item)."""
        return self.generation.text if self.generation is not None else ""


METRICS = (
    MetricSpec("longcontext", "recall_accuracy", "share", "higher", "rate", "pct", "mcnemar", "pass key recalled"),
    *[MetricSpec("longcontext", f"seq_rep_{n}", "share", "lower", "continuous", "pct", "paired_bootstrap", f"repeated word {n}-grams")
      for n in (2, 3, 4)],
    MetricSpec("longcontext", "distinct_2", "share", "higher", "continuous", "pct", "paired_bootstrap", "distinct word 2-grams"),
    MetricSpec("longcontext", "task_accuracy", "share", "higher", "rate", "pct", "mcnemar",
               "long-context task answered exactly (every answer in the output)"),
    MetricSpec("longcontext", "effective_length", "tokens", "higher", "continuous", "num", "none",
               "longest length whose task accuracy is at or above the threshold (0: none)"),
    MetricSpec("longcontext", "skipped_items", "items", "none", "count", "count", "none", "items that did not fit the context"),
)

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key? The pass key is"
RECALL_TOKENS = 16  # enough for " 71432." even with one token per digit, plus slack for a leading phrase
SNAP_WINDOW = 64  # tokens to look back for a sentence end before inserting the needle
REP_METRICS = (("seq_rep_2", seq_rep_n, 2), ("seq_rep_3", seq_rep_n, 3), ("seq_rep_4", seq_rep_n, 4),
               ("distinct_2", distinct_n, 2))

Records = SuiteRecords[LongContextRecord]


def passkey(seed: int, length: int, depth: float) -> str:
    """A 5-digit key per (length, depth): its own Generator, so adding a length never changes other keys."""
    rng = np.random.default_rng([seed, length, int(round(depth * 10_000))])
    return str(int(rng.integers(10_000, 100_000)))


def tokens_sha256(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()


def rep_scores(text: str) -> dict[str, float]:
    """Repetition metrics of one continuation, on whitespace words (same units for every tokenizer)."""
    w = words(text)
    return {name: fn(w, n) for name, fn, n in REP_METRICS}


class LongContextSuite(Suite["LongContextSettings"]):
    name = "longcontext"
    requires = frozenset({Capability.GENERATE, Capability.TOKENIZER})

    def _filler_path(self) -> Path:
        return resolve_data_path(self.settings.filler, self.config_file)

    def _filler_text(self) -> str:
        path = self._filler_path()
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DataError(str(path), "filler text not found (suites.longcontext.filler)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(str(path), f"cannot read filler text: {e}") from None
        if not text.strip():
            raise DataError(str(path), "filler text is empty")
        return text

    def items(self) -> list[Item]:
        s = self.settings
        out: list[Item] = []
        for L in sorted(s.lengths):
            out.append(Item(f"rep/L{L}", f"L{L}", {"kind": "rep", "length": L}))
            for d in s.depths:
                out.append(Item(f"recall/L{L}/D{d:.2f}", f"L{L}",
                                {"kind": "recall", "length": L, "depth": d, "passkey": passkey(s.seed, L, d)}))
            for task in s.tasks:
                for k in range(s.task_samples):
                    out.append(Item(f"{task}/L{L}/S{k}", f"L{L}", {"kind": task, "length": L, "sample": k}))
        return out

    # -- building prompts ----------------------------------------------------------------------------

    def _filler_tokens(self, engine: Engine, needed: int) -> tuple[list[int], int]:
        """At least `needed` filler tokens; the text is repeated (blank line between copies) when too short."""
        text = self._filler_text()
        once = engine.tokenize(text, add_bos=False)
        if len(once) >= needed:
            return once, 1
        repeats = math.ceil(needed / max(1, len(once)))
        while True:
            ids = engine.tokenize((text.rstrip() + "\n\n") * repeats, add_bos=False)
            if len(ids) >= needed:
                return ids, repeats
            repeats += 1

    @staticmethod
    def _snap(engine: Engine, filler: Sequence[int], pos: int) -> int:
        """Move an insertion point back to just after a sentence end, so the needle is its own sentence."""
        for j in range(pos, max(0, pos - SNAP_WINDOW), -1):
            piece = engine.detokenize(filler[j - 1 : j])
            if "\n" in piece or piece.rstrip()[-1:] in (".", "!", "?"):
                return j
        return pos

    def _prompt(self, engine: Engine, item: Item, filler: list[int], bos: list[int]) -> tuple[list[int], dict[str, Any]]:
        L = item.data["length"]
        if item.data["kind"] == "rep":
            return bos + filler[: L - len(bos)], {}
        key = item.data["passkey"]
        needle = engine.tokenize(NEEDLE.format(key=key), add_bos=False)
        question = engine.tokenize(QUESTION, add_bos=False)
        budget = L - len(bos) - len(needle) - len(question)
        if budget <= 0:
            return [], {"skipped": f"length {L} leaves no room for filler around the needle"}
        body = filler[:budget]
        pos = self._snap(engine, body, round(item.data["depth"] * budget))
        ids = bos + body[:pos] + needle + body[pos:] + question
        return ids, {"needle_token_pos": len(bos) + pos, "depth_actual": pos / budget}

    # -- running --------------------------------------------------------------------------------------

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        if not items:
            return
        n_ctx = engine.info().n_ctx
        bos = engine.tokenize("", add_bos=True)  # [] or [BOS]: whatever this model prepends
        # Sized from the settings, not the pending items, so a resumed run cuts exactly the same prompts;
        # capped at n_ctx because longer lengths are skipped anyway.
        filler, repeats = self._filler_tokens(engine, min(max(self.settings.lengths), n_ctx))
        by_length: dict[int, list[Item]] = defaultdict(list)
        for item in items:
            by_length[item.data["length"]].append(item)
        for L in sorted(by_length):
            emit(self._run_length(engine, by_length[L], sampling, n_ctx, bos, filler, repeats))

    def _run_length(self, engine: Engine, items: list[Item], sampling: SamplingParams, n_ctx: int,
                    bos: list[int], filler: list[int], repeats: int) -> list[dict[str, Any]]:
        records: list[LongContextRecord | None] = []
        requests: list[GenRequest] = []
        meta: dict[str, dict[str, Any]] = {}
        for item in _prefix_chain(items, sorted(self.settings.lengths).index(items[0].data["length"])):
            L, kind = item.data["length"], item.data["kind"]
            if kind in longtasks.TASKS:
                records.append(self._task_item(engine, item, n_ctx, bos, filler, repeats, meta, requests))
                continue
            new = self.settings.continuation_tokens if kind == "rep" else RECALL_TOKENS
            base = {"item_id": item.item_id, "category": item.category, "kind": kind,
                    "length_target": L, "depth": item.data.get("depth"), "passkey": item.data.get("passkey"),
                    "n_ctx": n_ctx, "filler_repeats": repeats}
            if L + new > n_ctx:
                records.append(LongContextRecord(
                    **base, skipped=f"length {L} + {new} new tokens exceeds the engine's n_ctx {n_ctx}"))
                continue
            ids, extra = self._prompt(engine, item, filler, bos)
            if "skipped" in extra:
                records.append(LongContextRecord(**base, **extra))
                continue
            meta[item.item_id] = base | extra | {"n_prompt_tokens": len(ids), "prompt_sha256": tokens_sha256(ids)}
            requests.append(GenRequest(key=item.item_id, prompt="", chat=False, max_tokens=new, prompt_token_ids=tuple(ids)))
        for res in engine.generate(requests, sampling):
            m = meta[res.key]
            outcome: dict[str, Any] = {"correct": (m["passkey"] in res.output_text) if m["kind"] == "recall" else None}
            if m["kind"] in longtasks.TASKS:
                hits = longtasks.found(m["answers"], res.output_text)
                outcome = {"answers_found": hits, "correct": all(hits)}
            records.append(LongContextRecord(**m, generation=Generation.of(res), **outcome, **provenance(res)))
        return [dump_record(r) for r in records if r is not None]

    def _task_item(self, engine: Engine, item: Item, n_ctx: int, bos: list[int], filler: list[int], repeats: int,
                   meta: dict[str, dict[str, Any]], requests: list[GenRequest]) -> LongContextRecord | None:
        """A RULER-style task item: its prompt queued (None returned), or its skipped record."""
        L, task, k = item.data["length"], item.data["kind"], item.data["sample"]
        base = {"item_id": item.item_id, "category": item.category, "kind": task, "length_target": L,
                "sample": k, "n_ctx": n_ctx, "filler_repeats": repeats}
        if L > n_ctx:
            return LongContextRecord(**base, skipped=f"length {L} exceeds the engine's n_ctx {n_ctx}")
        text = self._filler_text()
        spec = longtasks.make_item(task, self.settings.seed, L, k, text)
        built = longtasks.build_prompt(spec, L, self.settings.seed, k, bos, filler,
                                       lambda s: engine.tokenize(s, add_bos=False), text)
        if built.skipped:
            return LongContextRecord(**base, answers=list(built.answers), skipped=built.skipped)
        meta[item.item_id] = base | {"answers": list(built.answers), "needle_positions": list(built.needle_positions),
                                     "n_prompt_tokens": len(built.ids), "prompt_sha256": tokens_sha256(built.ids)}
        requests.append(GenRequest(key=item.item_id, prompt="", chat=False, max_tokens=longtasks.BUDGET[task],
                                   prompt_token_ids=tuple(built.ids)))
        return None

    # -- scores ---------------------------------------------------------------------------------------

    def score(self, records: Records, ctx: ScoreContext) -> list[ScoreRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        rows: list[ScoreRow] = []
        for dep, recs in records.items():
            for cat in _lengths(recs):
                of_len = [r for r in recs if r.category == cat]
                skipped = sum(r.skipped is not None for r in of_len)
                if skipped:
                    rows.append(ScoreRow(dep, self.name, cat, "skipped_items", float(skipped), n=len(of_len)))
                for r in (r for r in of_len if r.kind == "rep" and r.skipped is None):
                    for metric, value in rep_scores(r.output).items():
                        rows.append(ScoreRow(dep, self.name, cat, metric, value, n=1))
                rows.extend(_recall_row(dep, self.name, cat, of_len, ctx.stats))
            rows.extend(_recall_row(dep, self.name, "all", recs, ctx.stats))
            rows.extend(_task_rows(dep, self.name, recs, ctx.stats, self.settings.effective_threshold))
        return rows

    def compare(self, records: Records, ctx: ScoreContext) -> list[ComparisonRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        ref = ctx.reference
        rows: list[ComparisonRow] = []
        for dep, pairs in paired_with_reference(records, ref, keep=lambda r: r.skipped is None).items():
            for cat in _lengths(r for _, r in pairs):
                rep = [(a, b) for a, b in pairs if b.category == cat and b.kind == "rep"]
                for metric, _, _ in REP_METRICS:
                    vals = [(rep_scores(a.output)[metric], rep_scores(b.output)[metric]) for a, b in rep]
                    vals = [(x, y) for x, y in vals if not (math.isnan(x) or math.isnan(y))]
                    if vals:
                        # one item per length -> a difference with n = 1 and no interval
                        rows.append(continuous_row(dep, ref, self.name, cat, metric, [y for _, y in vals],
                                                   [x for x, _ in vals], ctx.stats))
                rows.extend(_recall_compare(dep, ref, self.name, cat, [(a, b) for a, b in pairs if b.category == cat],
                                            ctx.stats))
            rows.extend(_recall_compare(dep, ref, self.name, "all", pairs, ctx.stats))
            for task, cat, _ in _task_groups([b for _, b in pairs]):
                sel = [(a, b) for a, b in pairs if b.kind == task and (cat.endswith(" all") or b.category == cat.split()[-1])]
                rows.extend(pass_fail_rows(Compared(dep, ref, self.name, cat, "task_accuracy"), [bool(b.correct) for _, b in sel],
                                           [bool(a.correct) for a, _ in sel], ctx.stats, flips=True))
        return rows

    def item_rows(self, records: Records, ctx: ScoreContext) -> list[dict[str, Any]]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        rows = []
        for dep, recs in records.items():
            for r in recs:
                row = {"item_id": r.item_id, "deployment": dep, "category": r.category, "kind": r.kind,
                       "length_target": r.length_target, "depth": r.depth, "passkey": r.passkey,
                       "skipped": r.skipped or "", "n_prompt_tokens": r.n_prompt_tokens,
                       "n_output_tokens": r.generation.n_output_tokens if r.generation else None,
                       "output": r.generation.output_text if r.generation else None,
                       "correct": r.correct}
                if r.kind == "rep" and r.skipped is None:
                    row |= rep_scores(r.output)
                rows.append(row)
        return rows

    def describe(self) -> dict[str, Any]:
        s, path = self.settings, self._filler_path()
        return {
            "filler": str(path),
            "filler_sha256": hashlib.sha256(self._filler_text().encode("utf-8")).hexdigest(),
            "lengths": sorted(s.lengths),
            "length_unit": "prompt tokens incl. BOS, cut with each deployment's tokenizer",
            "depths": list(s.depths),
            "continuation_tokens": s.continuation_tokens,
            "recall_tokens": RECALL_TOKENS,
            "seed": s.seed,
            "needle": NEEDLE,
            "question": QUESTION,
            "repetition_units": "whitespace words of the continuation",
        }


# -- helpers (records only) -----------------------------------------------------------------------


def _prefix_chain(items: list[Item], rank: int) -> list[Item]:
    """One length's items in the order that shares the most prompt with the item before, for an engine whose
    cache holds only the last prompt (llama.cpp, llama-server's slot): the plain filler, then needles from the
    deepest (each shares the filler up to its needle), then the tasks. Every other length (by `rank` among the
    settings' lengths) runs that chain backwards, so each pair of lengths meets at their plain-filler prompts,
    the shorter one a prefix of the longer (1024 tokens reused at 2048, not the ~100 before the shallowest
    needle). The order changes no prompt and, llama.cpp's reuse being exact, no output."""
    chain = sorted(items, key=lambda it: (it.data["kind"] != "rep", it.data["kind"] != "recall", -it.data.get("depth", 0.0)))
    return chain if rank % 2 else chain[::-1]


def _lengths(recs: Iterable[LongContextRecord]) -> list[str]:
    return sorted({r.category for r in recs}, key=lambda c: int(c[1:]))


def _task_groups(recs: Sequence[LongContextRecord]) -> list[tuple[str, str, list[LongContextRecord]]]:
    """(task, category, records) for each task's lengths ("<task> L<L>") and the task over all lengths
    ("<task> all"), run items only."""
    out = []
    for task in longtasks.TASKS:
        done = [r for r in recs if r.kind == task and r.skipped is None]
        if not done:
            continue
        for cat in _lengths(done):
            out.append((task, f"{task} {cat}", [r for r in done if r.category == cat]))
        out.append((task, f"{task} all", done))
    return out


def _task_rows(dep: str, suite: str, recs: list[LongContextRecord], settings: StatsSettings, threshold: float) -> list[ScoreRow]:
    """Task accuracy per (task, length) and over all lengths, and each task's effective length: the longest
    length whose accuracy is at or above `threshold` (0 when none is)."""
    rows: list[ScoreRow] = []
    for task, cat, of in _task_groups(recs):
        rows.extend(pass_fail_scores(dep, suite, cat, "task_accuracy", [bool(r.correct) for r in of], settings))
        if cat.endswith(" all"):
            by_len: dict[int, list[bool]] = {r.length_target: [] for r in of}
            for r in of:
                by_len[r.length_target].append(bool(r.correct))
            ok = [L for L, v in by_len.items() if sum(v) / len(v) >= threshold]
            rows.append(ScoreRow(dep, suite, task, "effective_length", float(max(ok, default=0)), n=len(by_len)))
    return rows


def _recall_row(dep: str, suite: str, cat: str, recs: list[LongContextRecord], settings: StatsSettings) -> list[ScoreRow]:
    done = [r for r in recs if r.kind == "recall" and r.skipped is None]
    return pass_fail_scores(dep, suite, cat, "recall_accuracy", [bool(r.correct) for r in done], settings)


def _recall_compare(dep: str, ref: str, suite: str, cat: str,
                    pairs: list[tuple[LongContextRecord, LongContextRecord]], settings: StatsSettings) -> list[ComparisonRow]:
    pairs = [(a, b) for a, b in pairs if b.kind == "recall"]
    return pass_fail_rows(Compared(dep, ref, suite, cat, "recall_accuracy"), [bool(b.correct) for _, b in pairs],
                          [bool(a.correct) for a, _ in pairs], settings)


def _viewer_cell(rec: LongContextRecord) -> ItemCell:
    text = f"skipped: {rec.skipped}" if rec.skipped else rec.output
    prompt = f"({rec.kind} item, {rec.length_target} tokens" + (
        f", needle at depth {rec.depth}, pass key {rec.passkey})" if rec.kind == "recall" else ")")
    ok = -1 if rec.correct is None else int(bool(rec.correct))
    gen = rec.generation
    return ItemCell(text, text, ok, {"finish_reason": gen.finish_reason if gen else None}, None,
                    gen.output_token_ids if gen else None, prompt)


SPEC = SuiteSpec(
    name="longcontext",
    settings_model=LongContextSettings,
    suite_class=LongContextSuite,
    records=(LongContextRecord,),
    metrics=METRICS,
    title="Long context: repetition and recall",
    report="evalkit.suites.report.longcontext:section",
    verdict="evalkit.suites.report.longcontext:verdict_columns",
    viewer=ViewerSpec(cell=_viewer_cell),
)
