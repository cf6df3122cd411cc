"""Code generation scored by running it in the sandbox: HumanEval pass@1, and the prompts suite's `code` items.

HumanEval follows the original harness (openai/human-eval): the model continues the prompt (a signature
and docstring) as a plain completion, and prompt + completion is run with the task's `check(candidate)`.
Scoring needs only the records: each record carries its item's tests and entry point.
"""
from __future__ import annotations

import gzip
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evalkit.config import PositiveInt, resolve_data_path
from evalkit.engines.base import Engine, GenRequest, GenResult, SamplingParams
from evalkit.errors import DataError
from evalkit.metrics.compare import Compared, pass_fail_rows, pass_fail_scores
from evalkit.metrics.declarations import MetricSpec, flip_metrics
from evalkit.records import Generation, Record, dump_record, nested_generation, provenance, typed
from evalkit.sandbox import SandboxResult, extract_code, isolation, run_programs, run_tests, verdict_memo
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.engines.spec import Capability
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords, jsonl_values, paired_with_reference
from evalkit.suites.spec import SuiteSpec

if TYPE_CHECKING:
    from evalkit.config import Config


class HumanEvalSettings(BaseModel):
    """`suites.humaneval`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    limit: PositiveInt | None = None
    timeout_s: float = Field(default=10.0, gt=0)


class HumanEvalRecord(Record):
    suite: Literal["humaneval"] = "humaneval"
    prompt: str
    prompt_token_ids: list[int]
    generation: Generation
    entry_point: str | None = None  # records written before they carried their task: completed from the data
    test: str | None = None

    @classmethod
    def from_v2(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return nested_generation(raw)


METRICS = (MetricSpec("humaneval", "pass@1", "share", "higher", "rate", "pct", "mcnemar"), *flip_metrics("humaneval"))

log = logging.getLogger(__name__)

Records = SuiteRecords[HumanEvalRecord]
BATCH = 16  # records per flushed batch
_FIELDS = ("task_id", "prompt", "test", "entry_point")


def code_item_program(output: str, item_data: dict[str, Any]) -> tuple[str, str, str | None]:
    """(code, tests, entry_point) that run_tests runs for a chat answer to a prompts-suite code item."""
    entry = item_data.get("entry_point")
    return extract_code(output, entry_point=entry), item_data["tests"], entry


def score_code_item(output: str, item_data: dict[str, Any], timeout_s: float, memo: Path | None = None) -> dict[str, Any]:
    """Run a chat answer's code against a prompts-suite item (`tests`: asserts, `entry_point`); `memo`: see run_tests."""
    r = run_tests(*code_item_program(output, item_data), timeout_s=timeout_s, memo=memo)
    return {"passed": r.passed, "status": r.status, "detail": r.detail}


# -- loading -------------------------------------------------------------------------------------


def load_humaneval(path: str | Path) -> list[Item]:
    """HumanEval JSONL (plain or .gz): task_id, prompt, canonical_solution, test, entry_point per line."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        raise DataError(str(path), f"cannot read: {e}") from None
    def line_error(n: int, problem: str) -> DataError:  # HumanEval's messages say "<file>: line <n>: ..."
        return DataError(str(path), f"line {n}: {problem}")

    items: list[Item] = []
    seen: set[str] = set()
    for lineno, row in jsonl_values(text, line_error):
        if not isinstance(row, dict):
            raise line_error(lineno, "expected a JSON object")
        bad = [k for k in _FIELDS if not isinstance(row.get(k), str) or not row[k].strip()]
        if bad:
            raise line_error(lineno, f"missing or empty field {bad[0]!r} (expected {', '.join(_FIELDS)})")
        if row["task_id"] in seen:
            raise line_error(lineno, f"duplicate task_id {row['task_id']!r}")
        seen.add(row["task_id"])
        data = {k: row[k] for k in ("prompt", "test", "entry_point")}
        data["canonical_solution"] = row.get("canonical_solution")
        items.append(Item(row["task_id"], "code", data))
    if not items:
        raise DataError(str(path), "no tasks in file")
    return items


# -- the suite -----------------------------------------------------------------------------------


class HumanEvalSuite(Suite["HumanEvalSettings"]):
    name = "humaneval"
    requires = frozenset({Capability.GENERATE})

    def __init__(self, settings: HumanEvalSettings, config: Config, config_file: Path) -> None:
        super().__init__(settings, config, config_file)
        self.path = resolve_data_path(settings.path, config_file)
        self._items: list[Item] | None = None
        self._results: dict[str, SandboxResult] = {}  # memo: sandbox runs are the expensive part of scoring

    def items(self) -> list[Item]:
        if self._items is None:
            items = load_humaneval(self.path)
            self._items = items[: self.settings.limit] if self.settings.limit is not None else items
        return self._items

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        by_id = {it.item_id: it for it in items}
        # base-model style: the model continues the signature; no chat template
        requests = [GenRequest(key=it.item_id, prompt=it.data["prompt"], chat=False) for it in items]
        batch: list[dict[str, Any]] = []
        for res in engine.generate(requests, sampling):
            batch.append(self._record(by_id[res.key], res))
            if len(batch) >= BATCH:
                emit(batch)
                batch = []
        if batch:
            emit(batch)

    def _record(self, item: Item, res: GenResult) -> dict[str, Any]:
        return dump_record(HumanEvalRecord(
            item_id=item.item_id, category="code",
            prompt=item.data["prompt"], prompt_token_ids=res.prompt_token_ids,
            generation=Generation.of(res),
            entry_point=item.data["entry_point"], test=item.data["test"], **provenance(res),
        ))

    # -- scoring (records only) -----------------------------------------------------------------

    def _run_all(self, records: Records, ctx: ScoreContext) -> dict[str, dict[str, SandboxResult]]:
        """deployment -> item_id -> sandbox result, running each distinct program once (verdicts kept in the result
        cache for runs that use it: `sandbox.verdict_memo`)."""
        keyed: dict[tuple[str, str], tuple[str, str, HumanEvalRecord]] = {}
        for dep, recs in records.items():
            for r in recs:
                r = self._with_task(r)
                code = extract_code(r.generation.text, prompt=r.prompt, entry_point=r.entry_point)
                keyed[(dep, r.item_id)] = (self._key(code, r), code, r)
        todo = {k: (code, r.test or "", r.entry_point) for k, code, r in keyed.values() if k not in self._results}
        if todo:
            log.info("humaneval: running %d programs in the sandbox", len(todo))
            self._results.update(run_programs(todo, self.settings.timeout_s, verdict_memo(ctx.manifest)))
        out: dict[str, dict[str, SandboxResult]] = {dep: {} for dep in records}
        for (dep, item_id), (k, _, _) in keyed.items():
            out[dep][item_id] = self._results[k]
        return out

    def _with_task(self, rec: HumanEvalRecord) -> HumanEvalRecord:
        """Records carry their task's tests; ones written without them are completed from the data file."""
        if rec.test and rec.entry_point:
            return rec
        item = {it.item_id: it for it in self.items()}.get(rec.item_id)
        if item is None:
            raise DataError(str(self.path), f"task {rec.item_id!r} of the records is not in the file")
        return rec.model_copy(update={"test": item.data["test"], "entry_point": item.data["entry_point"]})

    def _key(self, code: str, rec: HumanEvalRecord) -> str:
        h = hashlib.sha256()
        for part in (code, rec.test or "", rec.entry_point or "", repr(self.settings.timeout_s)):
            h.update(part.encode("utf-8") + b"\0")
        return h.hexdigest()

    def score(self, records: Records, ctx: ScoreContext) -> list[ScoreRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        results = self._run_all(records, ctx)
        rows = []
        for dep, by_item in results.items():
            rows += pass_fail_scores(dep, self.name, "code", "pass@1", [r.passed for r in by_item.values()], ctx.stats)
        return rows

    def compare(self, records: Records, ctx: ScoreContext) -> list[ComparisonRow]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        ref = ctx.reference
        paired = paired_with_reference(records, ref)
        if not paired:
            return []
        results = self._run_all(records, ctx)
        rows: list[ComparisonRow] = []
        for dep, pairs in paired.items():
            dep_ok = [results[dep][d.item_id].passed for _, d in pairs]
            ref_ok = [results[ref][a.item_id].passed for a, _ in pairs]
            rows += pass_fail_rows(Compared(dep, ref, self.name, "code", "pass@1"), dep_ok, ref_ok, ctx.stats,
                                   flips=True, unit="tasks")
        return rows

    def item_rows(self, records: Records, ctx: ScoreContext) -> list[dict[str, Any]]:
        records = typed(records)  # raw records lines are parsed here (evalkit.records)
        results = self._run_all(records, ctx)
        ref_by = results.get(ctx.reference, {})
        rows = []
        for dep, recs in records.items():
            for rec in recs:
                res = results[dep][rec.item_id]
                base = ref_by.get(rec.item_id) if dep != ctx.reference else None
                flip = ""
                if base is not None and base.passed != res.passed:
                    flip = "right->wrong" if base.passed else "wrong->right"
                rows.append({
                    "suite": self.name, "item_id": rec.item_id, "deployment": dep, "category": "code",
                    "output": rec.generation.text, "finish_reason": rec.generation.finish_reason,
                    "passed": res.passed, "status": res.status, "detail": res.detail,
                    "reference_passed": base.passed if base is not None else None, "flip": flip,
                })
        return rows

    def describe(self) -> dict[str, Any]:
        try:
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            digest = None
        try:
            sandbox = isolation().describe()
        except RuntimeError as e:
            sandbox = {"isolation": f"unavailable: {e}"}
        return {
            "dataset": "HumanEval", "path": str(self.path), "sha256": digest, "limit": self.settings.limit,
            "timeout_s": self.settings.timeout_s, "prompting": "plain completion of the task prompt, pass@1",
            "sandbox": sandbox,
        }


SPEC = SuiteSpec(
    name="humaneval",
    settings_model=HumanEvalSettings,
    suite_class=HumanEvalSuite,
    records=(HumanEvalRecord,),
    metrics=METRICS,
    title="HumanEval",
    report="evalkit.suites.report.humaneval:section",
    verdict="evalkit.suites.report.humaneval:verdict_columns",
)
