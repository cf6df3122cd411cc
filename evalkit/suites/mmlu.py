"""MMLU subset: lm-evaluation-harness's default `mmlu` prompt, letters ranked by log-likelihood, flips vs reference.

Prompt and scoring follow lm-evaluation-harness `lm_eval/tasks/mmlu/default/_default_template_yaml`
(doc_to_text "{{question.strip()}}\\nA. {{choices[0]}}\\nB. ...\\nD. {{choices[3]}}\\nAnswer:",
doc_to_choice ["A","B","C","D"], fewshot_split dev, sampler first_n), the per-subject description written by
`lm_eval/tasks/mmlu/_generate_configs.py` ("The following are multiple choice questions (with answers)
about {' '.join(subject.split('_'))}.\\n\\n"), and `lm_eval/api/samplers.py` (target_delimiter " ",
fewshot_delimiter "\\n\\n"; continuation = " " + letter).
"""
from __future__ import annotations

import csv
import difflib
import hashlib
import json
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from evalkit.config import PositiveInt, Seed, resolve_data_path
from evalkit.engines.base import Engine, SamplingParams
from evalkit.errors import DataError
from evalkit.metrics.compare import Compared, pass_fail_rows, pass_fail_scores
from evalkit.metrics.declarations import MetricSpec, flip_metrics
from evalkit.records import Record, call_provenance, combined, dump_record, provenance, typed
from evalkit.resources import resource_path
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords, at_line, jsonl_values, paired_with_reference
from evalkit.suites.spec import ItemCell, SuiteSpec, ViewerSpec



class MmluSettings(BaseModel):
    """`suites.mmlu`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(default="builtin", min_length=1)  # "builtin", "hf" (cais/mmlu via datasets) or a local directory
    subjects: list[str] | None = Field(default=None, min_length=1)
    per_subject: PositiveInt | None = 20
    shots: int = Field(default=5, ge=0, le=5)
    seed: Seed = 0


class MmluTimings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_s: float
    batch_size: int
    per_item_s: float


class MmluRecord(Record):
    suite: Literal["mmlu"] = "mmlu"
    prompt_token_ids: list[int]
    n_prompt_tokens: int
    prompt_sha256: str
    letter_token_ids: list[int] | None = None  # None: the letters were not single tokens
    # How the letters' log-probs were read: "one-pass" (the answer position's whole distribution, at the letters'
    # ids), "answer-top-k" (from the top-k a server returned for the answer position: llama-server's n_probs, an
    # OpenAI server's logprobs), "four-continuations" (each " X" scored as a continuation: prompt log-probs).
    method: Literal["one-pass", "answer-top-k", "four-continuations"]
    choice_logprobs: list[float]
    pred: str
    gold: str
    correct: bool
    timings: MmluTimings


METRICS = (
    MetricSpec("mmlu", "accuracy", "share", "higher", "rate", "pct", "mcnemar"),
    *flip_metrics("mmlu"),
    MetricSpec("mmlu", "four_continuation_items", "items", "none", "count", "count", "none",
               "questions scored by four continuations (letters not single tokens, or outside a server's top-k)"),
    MetricSpec("mmlu", "answer_top_k_items", "items", "none", "count", "count", "none",
               "questions whose letters were read from the top-k log-probs a server returned for the answer position"),
)
# Items read otherwise than "one-pass" (the in-process engines' way), counted per deployment for the report.
METHOD_METRICS = {"answer-top-k": "answer_top_k_items", "four-continuations": "four_continuation_items"}

LETTERS = ("A", "B", "C", "D")
BUILTIN_LABEL = "evalkit-mc (not MMLU)"
BATCH = 32  # questions per engine call / per flushed batch of records
LOCAL_HINT = "point at a local copy: suites.mmlu.source: /path/to/mmlu"


@dataclass(frozen=True)
class Question:
    subject: str
    index: int  # 0-based row of this subject in its split: stable across CSV and HF exports
    question: str
    choices: tuple[str, str, str, str]
    answer: int  # 0..3


@dataclass(frozen=True)
class McData:
    test: dict[str, list[Question]]
    dev: dict[str, list[Question]]
    origin: str  # where it was read from
    label: str  # "MMLU" or BUILTIN_LABEL: reports must not call evalkit's own set MMLU


# -- loading ----------------------------------------------------------------------------------


HUB_SOURCE = "hf"  # suites.mmlu.source: cais/mmlu from the Hugging Face hub


def load_mc_data(source: str, config_file: Path) -> McData:
    """Resolve `suites.mmlu.source` ("builtin", "hf" or a directory) into test/dev questions per subject."""
    if source == "builtin":
        root = resource_path("texts/evalkit-mc")
        if not root.is_dir():
            raise DataError(str(root), f"evalkit's built-in multiple-choice set is missing; {LOCAL_HINT}")
        data = _load_csv_layout(root)
        return McData(data.test, data.dev, f"builtin:{root}", BUILTIN_LABEL)
    if source == HUB_SOURCE:
        return _load_hf()
    root = resolve_data_path(source, config_file)
    if not root.is_dir():
        raise DataError(f"suites.mmlu.source: {source}",
                        "not a directory (expected MMLU's CSV layout or an HF parquet/JSONL export)")
    for base in (root, root / "data"):
        if (base / "test").is_dir():
            return _load_csv_layout(base)
    return _load_export(root)


def _load_csv_layout(root: Path) -> McData:
    """The original Hendrycks layout: <root>/{test,dev}/<subject>_{test,dev}.csv, no header."""
    test = _read_csv_split(root / "test", "test")
    if not test:
        raise DataError(str(root / "test"), "no <subject>_test.csv files")
    dev = _read_csv_split(root / "dev", "dev") if (root / "dev").is_dir() else {}
    return McData(test, dev, str(root), "MMLU")


def _read_csv_split(folder: Path, split: str) -> dict[str, list[Question]]:
    out: dict[str, list[Question]] = {}
    suffix = f"_{split}.csv"
    for path in sorted(folder.glob(f"*{suffix}")):
        subject = path.name[: -len(suffix)]
        rows: list[Question] = []
        try:
            with path.open(encoding="utf-8", newline="") as f:
                reader = csv.reader(f)
                for row in reader:
                    if not row or all(not c.strip() for c in row):
                        continue
                    where = f"{path}:{reader.line_num}"
                    if len(row) != 6:
                        raise DataError(where, f"expected 6 columns (question,A,B,C,D,answer), got {len(row)}")
                    choices = (row[1], row[2], row[3], row[4])
                    rows.append(Question(subject, len(rows), row[0], choices, _answer_index(row[5], where)))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise DataError(str(path), f"cannot read: {e}") from None
        out[subject] = rows
    return out


def _answer_index(value: Any, where: str) -> int:
    """Answer as an index 0-3: CSV files use letters, HF exports integers."""
    if isinstance(value, str) and value.strip().upper() in LETTERS:
        return LETTERS.index(value.strip().upper())
    try:
        idx = int(value)
    except (TypeError, ValueError):
        idx = -1
    if not 0 <= idx <= 3 or (isinstance(value, float) and value != idx):
        raise DataError(where, f"answer must be A-D or 0-3, got {value!r}")
    return idx


_SPLIT = re.compile(r"(?:^|[^a-z])(test|dev)(?:[^a-z]|$)")


def _load_export(root: Path) -> McData:
    """An HF export (cais/mmlu): parquet or JSONL files named after their split, columns question, subject,
    choices (4), answer (0-3). The hub repo has per-subject folders *and* `all/`; use `all/` alone when present."""
    base = root / "all" if (root / "all").is_dir() else root
    files = sorted(p for p in base.rglob("*") if p.suffix in (".parquet", ".jsonl", ".json") and p.is_file())
    splits: dict[str, list[dict[str, Any]]] = {"test": [], "dev": []}
    for path in files:
        m = _SPLIT.search(path.name.lower())
        if m:
            splits[m.group(1)].extend(_read_export_file(path))
    if not splits["test"]:
        raise DataError(str(root), "no MMLU data found: expected test/<subject>_test.csv, or *test*.parquet / *test*.jsonl")
    return McData(_questions(splits["test"]), _questions(splits["dev"]), str(root), "MMLU")


def _read_export_file(path: Path) -> list[dict[str, Any]]:
    """Rows with `_where` (file:line or file:row) attached for error messages."""
    if path.suffix == ".parquet":
        try:
            import pandas as pd

            frame = pd.read_parquet(path)
        except ImportError:
            raise DataError(str(path), "reading parquet needs pyarrow (pip install pyarrow); or export as JSONL") from None
        except Exception as e:  # pyarrow raises its own types for corrupt files
            raise DataError(str(path), f"cannot read parquet: {e}") from None
        return [dict(r, _where=f"{path}:row {i + 1}") for i, r in enumerate(frame.to_dict("records"))]
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(str(path), f"cannot read: {e}") from None
    line_error = at_line(path)
    for n, row in jsonl_values(text, line_error):
        if not isinstance(row, dict):
            raise line_error(n, "expected a JSON object per line")
        rows.append(dict(row, _where=f"{path}:{n}"))
    return rows


def _questions(rows: Iterable[dict[str, Any]]) -> dict[str, list[Question]]:
    out: dict[str, list[Question]] = {}
    for row in rows:
        where = row.get("_where", "?")
        missing = [k for k in ("question", "subject", "choices", "answer") if k not in row]
        if missing:
            raise DataError(where, f"missing column(s) {', '.join(missing)}")
        choices = list(row["choices"]) if not isinstance(row["choices"], str) else None
        if choices is None or len(choices) != 4:
            raise DataError(where, f"choices must be a list of 4, got {row['choices']!r}")
        subject = str(row["subject"])
        of_subject = out.setdefault(subject, [])
        a, b, c, d = (str(x) for x in choices)
        of_subject.append(Question(subject, len(of_subject), str(row["question"]), (a, b, c, d), _answer_index(row["answer"], where)))
    return out


def _load_hf() -> McData:
    try:
        import datasets  # optional: only for source "hf"
    except ImportError:
        raise DataError("suites.mmlu.source: hf", f"the 'datasets' package is not installed; {LOCAL_HINT}") from None
    try:
        ds = datasets.load_dataset("cais/mmlu", "all")
    except Exception as e:  # offline shows up as ConnectionError, OSError or hub-specific errors
        problem = f"cannot load cais/mmlu ({type(e).__name__}; offline?); {LOCAL_HINT}"
        raise DataError("suites.mmlu.source: hf", problem) from None
    test = [dict(r, _where=f"cais/mmlu test row {i + 1}") for i, r in enumerate(ds["test"])]
    dev = [dict(r, _where=f"cais/mmlu dev row {i + 1}") for i, r in enumerate(ds["dev"])]
    return McData(_questions(test), _questions(dev), "hf:cais/mmlu/all", "MMLU")


# -- subset and prompt ------------------------------------------------------------------------


def select_questions(test: dict[str, list[Question]], subjects: list[str] | None, per_subject: int | None,
                     seed: int) -> list[Question]:
    """`per_subject` questions of each subject, sampled without replacement, in file order, subjects sorted.

    Each subject gets its own Generator seeded by (seed, crc32(subject)), so a subject's sample does not
    change when other subjects are added or removed. Same-subject questions stay consecutive so engines
    with prefix caching reuse the shared few-shot prefix.
    """
    names = sorted(test) if subjects is None else list(subjects)
    out: list[Question] = []
    for subject in sorted(names):
        if subject not in test:
            close = difflib.get_close_matches(subject, list(test), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DataError("suites.mmlu.subjects", f"unknown subject {subject!r}{hint}")
        rows = test[subject]
        if per_subject is None or per_subject >= len(rows):
            out.extend(rows)
            continue
        rng = np.random.default_rng([seed, zlib.crc32(subject.encode("utf-8"))])
        out.extend(rows[i] for i in sorted(rng.choice(len(rows), size=per_subject, replace=False).tolist()))
    return out


def describe_subject(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {' '.join(subject.split('_'))}.\n\n"


def format_example(q: Question) -> str:
    c = q.choices
    return f"{q.question.strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def format_prompt(q: Question, shots: Sequence[Question]) -> str:
    """The harness's context: description, each shot + " <letter>\\n\\n", then the question (no answer)."""
    labeled = "".join(f"{format_example(s)} {LETTERS[s.answer]}\n\n" for s in shots)
    return describe_subject(q.subject) + labeled + format_example(q)


# -- scoring helpers (records only) -----------------------------------------------------------


def _by_item(recs: list[MmluRecord]) -> dict[str, MmluRecord]:
    return {r.item_id: r for r in recs}


def _categories(recs: Iterable[MmluRecord]) -> list[str]:
    return ["all"] + sorted({r.category for r in recs})


def _in(cat: str, rec: MmluRecord) -> bool:
    return cat == "all" or rec.category == cat


# -- the suite --------------------------------------------------------------------------------


class MmluSuite(Suite["MmluSettings"]):
    name = "mmlu"
    requires = frozenset({Capability.TOKENIZER})
    # The answer position's distribution, or each choice scored as a continuation: either measures the letters.
    requires_any = frozenset({Capability.NEXT_TOKEN_LOGPROBS, Capability.PROMPT_LOGPROBS})

    def _data(self) -> McData:
        if getattr(self, "_cached", None) is None:
            self._cached = load_mc_data(self.settings.source, self.config_file)
        return self._cached

    def _shots(self, subject: str) -> list[Question]:
        k = self.settings.shots
        dev = self._data().dev.get(subject, [])
        if len(dev) < k:
            raise DataError(self._data().origin, f"subject {subject!r} has {len(dev)} dev examples; shots: {k} needs {k}")
        return dev[:k]  # first_n, as the harness's fewshot_config.sampler

    def items(self) -> list[Item]:
        s = self.settings
        chosen = select_questions(self._data().test, s.subjects, s.per_subject, s.seed)
        return [
            Item(f"{q.subject}/{q.index}", q.subject,
                 {"prompt": format_prompt(q, self._shots(q.subject)), "gold": LETTERS[q.answer]})
            for q in chosen
        ]

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        # Prefix reuse: items arrive subject by subject, so consecutive prompts share the description and
        # few-shot block (most of a 5-shot prompt's tokens). vLLM's prefix caching exploits that within a
        # batch; llama.cpp's next_token_logprobs keeps the shared prefix in its KV cache between consecutive
        # prompts (reuse point aligned so the log-probs stay bit-identical) and computes only the last
        # position's logits.
        for start in range(0, len(items), BATCH):
            emit(self._run_batch(engine, items[start : start + BATCH]))

    def _run_batch(self, engine: Engine, items: Sequence[Item]) -> list[dict[str, Any]]:
        prompts, one_pass, letter_ids = [], [], []
        for item in items:
            ids = engine.tokenize(item.data["prompt"], add_bos=True)
            # The harness tokenizes context+continuation whole and splits at len(context): reading the letters
            # off one next-token distribution is the same computation only if each " X" adds exactly one token.
            fulls = [engine.tokenize(item.data["prompt"] + " " + L, add_bos=True) for L in LETTERS]
            single = all(len(f) == len(ids) + 1 and f[: len(ids)] == ids for f in fulls)
            prompts.append((ids, fulls))
            one_pass.append(single)
            letter_ids.append([f[-1] for f in fulls] if single else None)

        logprobs: list[list[float]] = [[] for _ in items]
        prov: list[dict[str, Any]] = [{} for _ in items]  # cached / measured_at of each item's engine results
        # How this engine reads the answer position ("none": it cannot; every item is scored as continuations).
        answer_method = engine.info().next_token_method
        if answer_method == "none":
            one_pass = [False] * len(items)
        start = time.perf_counter()
        # One engine call per candidate set (the letter ids are the same for every prompt of a tokenizer,
        # but group defensively in case a prompt ending changes the merge).
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, letters in enumerate(letter_ids):
            if letters is not None and one_pass[i]:
                groups.setdefault(tuple(letters), []).append(i)
        for cand, idxs in groups.items():
            for i, lp in zip(idxs, engine.next_token_logprobs([prompts[i][0] for i in idxs], list(cand))):
                logprobs[i] = [float(x) for x in lp]
                if any(np.isnan(logprobs[i])):  # a letter outside the top-k a server gives: score continuations
                    one_pass[i] = False
            for i, p in zip(idxs, call_provenance(engine, len(idxs))):
                prov[i] = p
        fallback = [i for i, ok in enumerate(one_pass) if not ok]
        if fallback:
            seqs = [f for i in fallback for f in prompts[i][1]]
            scored = engine.score(seqs)
            for j, i in enumerate(fallback):
                n_ctx = len(prompts[i][0])
                logprobs[i] = [float(sum(lp for lp in s.logprobs[n_ctx:] if lp is not None))
                               for s in scored[4 * j : 4 * j + 4]]
                prov[i] = combined([provenance(s) for s in scored[4 * j : 4 * j + 4]])
        elapsed = time.perf_counter() - start

        out = []
        for i, item in enumerate(items):
            lps = logprobs[i]
            pred = LETTERS[int(np.argmax(lps))]  # first maximum on ties, as the harness's np.argmax
            ids = prompts[i][0]
            out.append(dump_record(MmluRecord(
                item_id=item.item_id,
                category=item.category,
                # Kept in full: cross-engine parity checks compare the exact tokens each engine was fed.
                prompt_token_ids=ids,
                n_prompt_tokens=len(ids),
                prompt_sha256=hashlib.sha256(item.data["prompt"].encode("utf-8")).hexdigest(),
                letter_token_ids=letter_ids[i],
                method=(answer_method if answer_method != "none" else "one-pass") if one_pass[i] else "four-continuations",
                choice_logprobs=lps,
                pred=pred,
                gold=item.data["gold"],
                correct=pred == item.data["gold"],
                timings=MmluTimings(batch_s=elapsed, batch_size=len(items), per_item_s=elapsed / len(items)),
                **prov[i],
            )))
        return out

    # -- scores -----------------------------------------------------------------------------------

    def score(self, records: SuiteRecords[MmluRecord], ctx: ScoreContext) -> list[ScoreRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        rows: list[ScoreRow] = []
        for dep, recs in records.items():
            if not recs:
                continue
            for cat in _categories(recs):
                rows += pass_fail_scores(dep, self.name, cat, "accuracy", [r.correct for r in recs if _in(cat, r)], ctx.stats)
            for method, metric in METHOD_METRICS.items():  # how the letters were read, shown in the report
                count = sum(r.method == method for r in recs)
                if count:
                    rows.append(ScoreRow(dep, self.name, "all", metric, float(count), n=len(recs)))
        return rows

    def compare(self, records: SuiteRecords[MmluRecord], ctx: ScoreContext) -> list[ComparisonRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        ref = ctx.reference
        rows: list[ComparisonRow] = []
        for dep, paired in paired_with_reference(records, ref).items():
            for cat in _categories(r for _, r in paired):
                sel = [(a, b) for a, b in paired if _in(cat, b)]
                ref_ok = [a.correct for a, _ in sel]
                dep_ok = [b.correct for _, b in sel]
                rows += pass_fail_rows(Compared(dep, ref, self.name, cat, "accuracy"), dep_ok, ref_ok, ctx.stats,
                                       flips=True, unit="questions")
        return rows

    def item_rows(self, records: SuiteRecords[MmluRecord], ctx: ScoreContext) -> list[dict[str, Any]]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        ref_by = _by_item(records.get(ctx.reference, []))
        rows = []
        for dep, recs in records.items():
            for r in recs:
                base = ref_by.get(r.item_id)
                flip = ""
                if base is not None and dep != ctx.reference and base.correct != r.correct:
                    flip = "right->wrong" if base.correct else "wrong->right"
                rows.append({
                    "item_id": r.item_id, "deployment": dep, "category": r.category,
                    "output": r.pred, "gold": r.gold, "correct": r.correct,
                    "reference_pred": base.pred if base else None,
                    "reference_correct": base.correct if base else None,
                    "flip": flip,
                    "choice_logprobs": " ".join(f"{L}:{lp:.4f}" for L, lp in zip(LETTERS, r.choice_logprobs)),
                    "n_prompt_tokens": r.n_prompt_tokens, "method": r.method,
                })
        return rows

    def describe(self) -> dict[str, Any]:
        s, data = self.settings, self._data()
        chosen = select_questions(data.test, s.subjects, s.per_subject, s.seed)
        h = hashlib.sha256()
        for q in chosen + [x for subj in sorted({q.subject for q in chosen}) for x in data.dev.get(subj, [])[: s.shots]]:
            h.update(json.dumps([q.subject, q.index, q.question, q.choices, q.answer]).encode("utf-8"))
        return {
            "dataset": data.label,
            "source": s.source,
            "origin": data.origin,
            "subjects": sorted({q.subject for q in chosen}),
            "per_subject": s.per_subject,
            "shots": s.shots,
            "seed": s.seed,
            "n_questions": len(chosen),
            "data_sha256": h.hexdigest(),  # the questions and shots actually used
            "prompt_format": "lm-evaluation-harness mmlu default (first-n dev shots; ' A'..' D' by log-likelihood)",
        }


def _viewer_cell(rec: MmluRecord) -> ItemCell:
    extra = {"gold": rec.gold, "method": rec.method, "choice_logprobs": [round(x, 4) for x in rec.choice_logprobs]}
    prompt = f"(multiple choice; prompt kept as {rec.n_prompt_tokens} token ids, gold answer {rec.gold})"
    return ItemCell(str(rec.pred), str(rec.pred), int(bool(rec.correct)), extra, rec.prompt_token_ids, None, prompt)


SPEC = SuiteSpec(
    name="mmlu",
    settings_model=MmluSettings,
    suite_class=MmluSuite,
    records=(MmluRecord,),
    metrics=METRICS,
    title="multiple choice",
    report="evalkit.suites.report.mmlu:section",
    verdict="evalkit.suites.report.mmlu:verdict_columns",
    viewer=ViewerSpec(cell=_viewer_cell),
    offline_description=lambda settings: (  # the hub's data are not fetched for a report
        {"source": HUB_SOURCE, "note": "not described offline (data on the hub)"} if settings.source == HUB_SOURCE else None),
)
