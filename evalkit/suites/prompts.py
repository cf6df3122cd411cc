"""The prompt suite: code, reasoning, translation and QA prompts; scored by tests, gold answers, BLEU/chrF."""
from __future__ import annotations

import re
import string
import unicodedata
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evalkit.config import PositiveInt, resolve_data_path
from evalkit.engines.base import Engine, GenRequest, SamplingParams
from evalkit.errors import DataError
from evalkit.resources import resource_path
from evalkit.metrics import bleu
from evalkit.metrics.compare import Compared, pass_fail_rows, pass_fail_scores
from evalkit.metrics.declarations import MetricSpec
from evalkit.records import Generation, Record, dump_record, nested_generation, provenance, typed
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords, at_line, jsonl_values, paired_with_reference
from evalkit.suites.spec import SuiteSpec


Category = Literal["code", "reasoning", "translation", "qa"]  # evalkit.config.CATEGORIES


class PromptsSettings(BaseModel):
    """`suites.prompts`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(default="prompts/", min_length=1)
    categories: list[Category] = Field(default=["code", "reasoning", "translation", "qa"], min_length=1)  # CATEGORIES
    limit_per_category: PositiveInt | None = None
    # Wall seconds a code answer's tests may run: human-eval's own harness and bigcode's use 3; these tests take
    # milliseconds, and an answer that loops held scoring for the whole timeout (10 s before).
    code_timeout_s: float = Field(default=3.0, gt=0)


class PromptRecord(Record):
    suite: Literal["prompts"] = "prompts"
    prompt: str
    prompt_format: str
    prompt_token_ids: list[int]
    n_prompt_tokens: int
    generation: Generation
    reference: str | None = None
    target_lang: str | None = None
    item: dict[str, Any]  # the prompt-file line: everything scoring needs travels with the record

    @classmethod
    def from_v2(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return nested_generation(raw)


_m = MetricSpec
METRICS = (
    _m("prompts", "pass@1", "share", "higher", "rate", "pct", "mcnemar", "code items whose tests pass"),
    _m("prompts", "exact_match", "share", "higher", "rate", "pct", "mcnemar", "normalized final answer equals a gold answer"),
    _m("prompts", "contains", "share", "higher", "rate", "pct", "mcnemar", "a gold answer appears in the final answer"),
    _m("prompts", "bleu_en-*", "BLEU points", "higher", "continuous", "score", "corpus_bootstrap", "corpus BLEU (sacrebleu)"),
    _m("prompts", "chrf_en-*", "chrF points", "higher", "continuous", "score", "corpus_bootstrap", "corpus chrF (sacrebleu)"),
    _m("prompts", "output_tokens_mean", "tokens", "none", "continuous", "num", "none", "mean generated tokens per item"),
)

Records = SuiteRecords[PromptRecord]

BATCH = 2  # records are flushed at least this often (cheap next to generation; bounds loss on a kill)


class PromptItem(BaseModel):
    """One line of a prompt file (see prompts/README.md)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str
    category: Literal["code", "reasoning", "translation", "qa"]
    prompt: str
    reference: str | None = None
    source: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    answers: list[str] | None = None
    tests: str | None = None
    entry_point: str | None = None

    @model_validator(mode="after")
    def _scoring_fields(self) -> "PromptItem":
        need = {
            "translation": ("reference", "target_lang"),
            "reasoning": ("answers",),
            "qa": ("answers",),
            "code": ("tests", "entry_point"),
        }[self.category]
        missing = [f for f in need if not getattr(self, f)]
        if missing:
            raise ValueError(f"{self.category} item needs field(s) {', '.join(missing)}")
        return self


def load_prompt_file(path: Path) -> list[PromptItem]:
    items = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(str(path), f"cannot read prompt file: {e}") from None
    line_error = at_line(path)
    for n, value in jsonl_values(text, line_error):
        try:
            items.append(PromptItem.model_validate(value))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            raise line_error(n, f"{where + ': ' if where else ''}{msg}") from None
    return items


def load_prompts(path: Path) -> list[PromptItem]:
    """All prompt items from a .jsonl file or every .jsonl in a directory; ids must be unique."""
    if not path.exists():
        raise DataError(str(path), "prompt path not found")
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise DataError(str(path), "no .jsonl prompt files in directory")
    items: list[PromptItem] = []
    seen: dict[str, Path] = {}
    for f in files:
        for item in load_prompt_file(f):
            if item.id in seen:
                raise DataError(str(f), f"duplicate item id {item.id!r} (also in {seen[item.id].name})")
            seen[item.id] = f
            items.append(item)
    return items


# -- answer matching --------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION_TO_SPACE = str.maketrans(dict.fromkeys(string.punctuation, " "))  # one C pass, not a Python loop per character


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization: lower case, no punctuation/articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.translate(_PUNCTUATION_TO_SPACE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


_FINAL = re.compile(r"answer\s*[:：]\s*(.+)", re.IGNORECASE)


def final_answer(output: str) -> str:
    """The text after the last 'Answer:' (the prompts ask for one), else the whole output."""
    found = _FINAL.findall(output)
    return found[-1].strip() if found else output


def exact_match(output: str, answers: Sequence[str]) -> bool:
    return match_answers(output, answers)[0]


def contains_answer(output: str, answers: Sequence[str]) -> bool:
    """The normalized answer appears as whole words in the normalized output."""
    return match_answers(output, answers)[1]


def match_answers(output: str, answers: Sequence[str]) -> tuple[bool, bool]:
    """(exact_match, contains_answer) of one output, normalizing the output and each answer once."""
    out = normalize_answer(final_answer(output))
    gold = [normalize_answer(a) for a in answers]
    padded = f" {out} "
    return any(out == g for g in gold), any(f" {g} " in padded for g in gold if g)


# -- the suite --------------------------------------------------------------------------------


class PromptsSuite(Suite["PromptsSettings"]):
    name = "prompts"
    requires = frozenset({Capability.GENERATE, Capability.TOKENIZER})

    def _path(self) -> Path:
        return resolve_data_path(self.settings.path, self.config_file)

    def items(self) -> list[Item]:
        chosen = [p for p in load_prompts(self._path()) if p.category in self.settings.categories]
        out: list[Item] = []
        for category in self.settings.categories:
            of_cat = [p for p in chosen if p.category == category]
            if self.settings.limit_per_category is not None:
                of_cat = of_cat[: self.settings.limit_per_category]
            out.extend(Item(p.id, p.category, p.model_dump(exclude_none=True)) for p in of_cat)
        return out

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        by_key = {i.item_id: i for i in items}
        requests = [GenRequest(key=i.item_id, prompt=i.data["prompt"], chat=True) for i in items]
        batch: list[dict[str, Any]] = []
        for result in engine.generate(requests, sampling):
            item = by_key[result.key]
            record = PromptRecord(
                item_id=item.item_id,
                category=item.category,
                prompt=item.data["prompt"],
                prompt_format=result.prompt_format,
                prompt_token_ids=result.prompt_token_ids,
                n_prompt_tokens=len(result.prompt_token_ids),
                generation=Generation.of(result),
                reference=item.data.get("reference"),
                target_lang=item.data.get("target_lang"),
                item=item.data,  # everything scoring needs travels with the record
                **provenance(result),
            )
            batch.append(dump_record(record))
            if len(batch) >= BATCH:
                emit(batch)
                batch = []
        emit(batch)

    # -- per-item scores ----------------------------------------------------------------------

    def _item_score(self, rec: PromptRecord) -> dict[str, Any]:
        cat = rec.category
        out = rec.generation.text
        if cat in ("reasoning", "qa"):
            exact, contains = match_answers(out, rec.item["answers"])
            return {"exact_match": float(exact), "contains": float(contains)}
        return {}

    def _per_item(self, records: Records, ctx: ScoreContext) -> dict[str, dict[str, dict[str, Any]]]:
        """deployment -> item_id -> per-item scores (memoised: code runs in a sandbox). Each distinct program
        (answer text + tests) runs once, `sandbox.SANDBOX_WORKERS` at a time: deployments often write the same code; a run
        that uses the result cache keeps the verdicts there (`sandbox.verdict_memo`) for the next re-score."""
        if getattr(self, "_memo", None) is None:
            from evalkit.sandbox import run_programs, verdict_memo
            from evalkit.suites.code import code_item_program

            def program(r: PromptRecord) -> tuple[str, str, str | None]:
                return r.generation.text, r.item["tests"], r.item.get("entry_point")

            programs = {program(r): code_item_program(r.generation.text, r.item)
                        for recs in records.values() for r in recs if r.category == "code"}
            ran = run_programs(programs, self.settings.code_timeout_s, verdict_memo(ctx.manifest))

            matched: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}

            def scores(r: PromptRecord) -> dict[str, Any]:
                if r.category != "code":
                    if r.category not in ("reasoning", "qa"):
                        return self._item_score(r)
                    # Deployments (and the two runs of a diff) often give the same answer: each distinct
                    # (output, answers) is matched once; every item gets its own dict.
                    answers = r.item.get("answers")
                    if not (isinstance(answers, list) and all(isinstance(a, str) for a in answers)):
                        return self._item_score(r)
                    key = (r.category, r.generation.text, tuple(answers))
                    if key not in matched:
                        matched[key] = self._item_score(r)
                    return dict(matched[key])
                res = ran[program(r)]
                return {"pass": float(res.passed), "sandbox_status": res.status, "sandbox_detail": res.detail}

            self._memo = {dep: {r.item_id: scores(r) for r in recs} for dep, recs in records.items()}
        return self._memo

    def score(self, records: Records, ctx: ScoreContext) -> list[ScoreRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        per_item = self._per_item(records, ctx)
        rows: list[ScoreRow] = []
        for dep, recs in records.items():
            for cat in self.settings.categories:
                cat_recs = [r for r in recs if r.category == cat]
                if not cat_recs:
                    continue
                if cat == "translation":
                    for lang, group in _by_lang(cat_recs).items():
                        hyps = [r.generation.text.strip() for r in group]
                        refs = [r.reference or "" for r in group]
                        for s in bleu.corpus_scores(hyps, refs, lang, ctx.stats):
                            rows.append(ScoreRow(dep, self.name, cat, f"{s.metric}_en-{lang}", s.score, s.ci_low, s.ci_high, s.n))
                    continue
                for metric in ("pass",) if cat == "code" else ("exact_match", "contains"):
                    ok = [per_item[dep][r.item_id][metric] > 0 for r in cat_recs]
                    rows += pass_fail_scores(dep, self.name, cat, "pass@1" if metric == "pass" else metric, ok, ctx.stats)
            rows.append(
                ScoreRow(dep, self.name, "all", "output_tokens_mean", sum(r.generation.n_output_tokens for r in recs) / len(recs), n=len(recs))
            )
        return rows

    def compare(self, records: Records, ctx: ScoreContext) -> list[ComparisonRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        ref = ctx.reference
        paired = paired_with_reference(records, ref)
        if not paired:
            return []
        per_item = self._per_item(records, ctx)
        rows: list[ComparisonRow] = []
        for dep, dep_pairs in paired.items():
            for cat in self.settings.categories:
                pairs = [(a, b) for a, b in dep_pairs if b.category == cat]
                if not pairs:
                    continue
                if cat == "translation":
                    ref_of = {b.item_id: a for a, b in pairs}
                    for lang, group in _by_lang([p[1] for p in pairs]).items():
                        base = [ref_of[r.item_id].generation.text.strip() for r in group]
                        sys_ = [r.generation.text.strip() for r in group]
                        refs = [r.reference or "" for r in group]
                        for name, p in bleu.paired_comparison(base, sys_, refs, lang, ctx.stats).items():
                            rows.append(ComparisonRow(dep, ref, self.name, cat, f"{name}_en-{lang}", p.value, p.reference_value,
                                                      p.diff, p.ci_low, p.ci_high, p.p_value, p.n, p.method,
                                                      p.significant))
                    continue
                metric = "pass" if cat == "code" else "contains"
                ref_ok = [per_item[ref][b.item_id][metric] > 0 for b, _ in pairs]
                dep_ok = [per_item[dep][d.item_id][metric] > 0 for _, d in pairs]
                rows += pass_fail_rows(Compared(dep, ref, self.name, cat, "pass@1" if metric == "pass" else metric),
                                       dep_ok, ref_ok, ctx.stats)
        return rows

    def item_rows(self, records: Records, ctx: ScoreContext) -> list[dict[str, Any]]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        per_item = self._per_item(records, ctx)
        rows = []
        for dep, recs in records.items():
            for r in recs:
                rows.append({
                    "suite": self.name, "item_id": r.item_id, "deployment": dep, "category": r.category,
                    "prompt": r.prompt, "output": r.generation.text, "reference": r.reference,
                    "n_output_tokens": r.generation.n_output_tokens, "finish_reason": r.generation.finish_reason,
                    **per_item[dep].get(r.item_id, {}),
                })
        return rows

    def describe(self) -> dict[str, Any]:
        from evalkit.models import sha256_of

        path = self._path()
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        return {
            "path": str(path),
            "files": {f.name: sha256_of(f) for f in files},
            "categories": list(self.settings.categories),
            "bleu_signatures": {lang: bleu.signatures(lang) for lang in ("zh", "de")},
        }


def _by_lang(recs: list[PromptRecord]) -> dict[str, list[PromptRecord]]:
    out: dict[str, list[PromptRecord]] = {}
    for r in recs:
        out.setdefault(r.target_lang or "und", []).append(r)
    return dict(sorted(out.items()))


def rubric_summary(category: str, rubrics_dir: Path | None = None) -> str:
    """The `Summary:` line of `rubrics/<category>.md`, quoted in every row of that category."""
    path = Path(rubrics_dir or resource_path("rubrics")) / f"{category}.md"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        raise DataError(str(path), f"no rubric for category {category!r}") from None
    for line in text.splitlines():
        if line.startswith("Summary:"):
            return line.removeprefix("Summary:").strip()
    raise DataError(str(path), "rubric has no line starting with 'Summary:'")



def _check_rubrics(suite: Suite[Any], items: list[Item], config: Any, config_file: Path) -> None:
    """Items must be selected, and blind rating sheets quote each prompt category's rubric: a missing one would
    surface only at export."""
    if not items:
        raise DataError(f"suites.{suite.name}", "selects no items (check its data and limits)")
    for category in [*suite.settings.categories, "pairwise"]:
        rubric_summary(category)


SPEC = SuiteSpec(
    name="prompts",
    settings_model=PromptsSettings,
    suite_class=PromptsSuite,
    records=(PromptRecord,),
    metrics=METRICS,
    title="Prompts: code, reasoning, translation, QA",
    report="evalkit.suites.report.prompts:section",
    signatures="evalkit.suites.report.prompts:signatures",
    verdict="evalkit.suites.report.prompts:verdict_columns",
    check=_check_rubrics,
    rated_outputs=True,  # humans rate these outputs (evalkit.rating) and a model judge grades them (evalkit.judge)
    rubric=rubric_summary,
)
