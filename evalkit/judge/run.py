"""Judging a run's outputs: the judge deployment through the result cache, its answers as records.

`<run>/judge/judgements.jsonl` holds one record per judge call (appended per batch, fsynced: an interrupted
judging resumes where it stopped); `<run>/judge/judge.json` the judge's identity, settings and what the last
judging cost (calls made, cache hits). The identity (model hash, engine, numerics options, prompt-template
and rubric hashes, sampling) is in the manifest and in every result-cache key, so a warm cache answers a
re-judging without loading the judge, and another judge never reads this one's answers.

Pointwise: every output of the judged categories, twice when `repeats` is 2 (the second pass with seed + 1:
a real second call, so self-consistency measures what the engine and sampling really vary). Pairwise: each
non-reference output against the reference's on the same item, in both orders.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, cast

from evalkit.cache import numerics_options, open_engine, wrap_engine
from evalkit.config import Config, JudgeSettings
from evalkit.engines import load_engine
from evalkit.engines.base import GenRequest, SamplingParams
from evalkit.judge.prompts import (
    pairwise_prompt, parse_pairwise, parse_pointwise, rubric_text, rubrics_dir_of, template_sha256,
)
from evalkit.scoring import records_by_suite
from evalkit.store import RecordWriter, RunDir, atomic_write_text, read_jsonl
from evalkit.suites import rated_suite

JUDGE_DIR = "judge"
JUDGEMENTS = "judgements.jsonl"
JUDGE_JSON = "judge.json"
BATCH = 8  # judge calls per engine call and per fsynced append


@dataclass(frozen=True)
class Output:
    item_id: str
    category: str
    deployment: str
    prompt: str
    answer: str
    gold: str | None


@dataclass(frozen=True)
class Call:
    key: str
    mode: str  # pointwise | pairwise
    pass_: int  # pointwise: 1, or 2 for the self-consistency pass
    order: str | None  # pairwise: "AB" (the deployment's answer shown as A) or "BA"
    output: Output
    reference_answer: str | None
    text: str  # the judge's prompt


def judged_outputs(run: RunDir, categories: Sequence[str] | None) -> dict[tuple[str, str], Output]:
    """(item, deployment) -> the output to judge, for every prompts-suite record of the judged categories."""
    manifest = run.manifest()
    by_suite = records_by_suite(run, list(manifest["deployment_order"]))
    out: dict[tuple[str, str], Output] = {}
    # the suite whose generated answers the judge grades: the one humans rate (SuiteSpec.rated_outputs)
    for dep, recs in by_suite.get(rated_suite() or "", {}).items():
        for r in recs:  # the prompts suite's records (prompt, generation, reference, item)
            r = cast(Any, r)
            if categories is not None and r.category not in categories:
                continue
            item = getattr(r, "item", {}) or {}
            answers = item.get("answers")
            gold = r.reference or (", ".join(str(a) for a in answers) if isinstance(answers, list) and answers else None)
            out[(r.item_id, dep)] = Output(r.item_id, r.category, dep, r.prompt, r.generation.text, gold)
    return out


def judge_calls(outputs: dict[tuple[str, str], Output], reference: str, settings: JudgeSettings,
                rubrics: Path) -> list[Call]:
    """Every judge call the settings ask for, in a fixed order (reference's outputs first)."""
    calls: list[Call] = []
    rubric = {c: rubric_text(rubrics, c) for c in sorted({o.category for o in outputs.values()})}
    ordered = sorted(outputs.values(), key=lambda o: (o.deployment != reference, o.deployment, o.item_id))
    if "pointwise" in settings.modes:
        from evalkit.judge.prompts import pointwise_prompt

        for p in range(1, settings.repeats + 1):
            for o in ordered:
                text = pointwise_prompt(rubric[o.category], o.prompt, o.answer, o.gold)
                calls.append(Call(f"pointwise/{p}/{o.deployment}/{o.item_id}", "pointwise", p, None, o, None, text))
    if "pairwise" in settings.modes:
        pw = rubric_text(rubrics, "pairwise")
        for o in ordered:
            ref = outputs.get((o.item_id, reference))
            if o.deployment == reference or ref is None:
                continue
            for order in ("AB", "BA"):
                a, b = (o.answer, ref.answer) if order == "AB" else (ref.answer, o.answer)
                text = pairwise_prompt(pw, o.prompt, a, b, o.gold)
                calls.append(Call(f"pairwise/{order}/{o.deployment}/{o.item_id}", "pairwise", 1, order, o, ref.answer, text))
    return calls


def rubrics_sha256(rubrics: Path, categories: Sequence[str]) -> str:
    names = sorted(set(categories)) + ["pairwise"]
    blob = "\x00".join(f"{n}\x01{rubric_text(rubrics, n)}" for n in names)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _sampling(settings: JudgeSettings, pass_: int) -> SamplingParams:
    s = settings.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed + pass_ - 1)


def _record(call: Call, raw: str, cached: bool, measured_at: str | None, identity_sha: str) -> dict[str, Any]:
    o = call.output
    rec: dict[str, Any] = {"key": call.key, "mode": call.mode, "pass": call.pass_, "order": call.order,
                           "item_id": o.item_id, "category": o.category, "deployment": o.deployment,
                           "answer_words": len(o.answer.split()), "raw": raw, "cached": cached,
                           "measured_at": measured_at, "identity_sha256": identity_sha}
    if call.mode == "pointwise":
        got = parse_pointwise(raw)
        rec |= {"score": got.value, "verdict": None, "outcome": None}
    else:
        got = parse_pairwise(raw)
        # The deployment's side: it was A in order AB and B in order BA.
        mine = "A" if call.order == "AB" else "B"
        outcome = None if got.value is None else ("tie" if got.value == "tie" else "win" if got.value == mine else "loss")
        rec |= {"score": None, "verdict": got.value, "outcome": outcome,
                "reference_words": len((call.reference_answer or "").split())}
    rec |= {"parsed": got.value is not None, "problem": got.problem, "reason": got.reason}
    return rec


def _batches(calls: Sequence[Call]) -> Iterator[list[Call]]:
    for i in range(0, len(calls), BATCH):
        yield list(calls[i:i + BATCH])


def run_judge(run_dir: Path, settings: JudgeSettings, config_file: Path | None, resolve: Callable[[Any], dict[str, Any]],
              use_cache: bool = True) -> dict[str, Any]:
    """Judge every output the settings ask for that this judge has not judged yet; returns what it cost.
    `resolve`: the judge deployment -> its manifest entry (evalkit.pipeline.resolve_deployment: model on disk,
    variant prepared, fingerprinted), passed in by the verb that runs it."""
    run = RunDir.open(run_dir)
    manifest = run.manifest()
    reference = str(manifest["reference"])
    rubrics = rubrics_dir_of(settings.rubrics, config_file)
    outputs = judged_outputs(run, settings.categories)
    calls = judge_calls(outputs, reference, settings, rubrics)  # a missing rubric stops here, before any call
    dep = settings.deployment
    resolved = resolve(dep)
    extra = {"judge": {"template_sha256": template_sha256(),
                       "rubrics_sha256": rubrics_sha256(rubrics, [o.category for o in outputs.values()])}}
    if use_cache:
        engine = open_engine(dep, resolved, f"judge {dep.name}", extra_parts=extra)
    else:
        engine = wrap_engine(load_engine(dep.engine, resolved.get("path"), dep.options, f"judge {dep.name}"), dep,
                             resolved, enabled=False)
    identity = {"deployment": dep.name, "engine": dep.engine, "model_source": dep.model.source if dep.model else None,
                "variant": dep.model.variant if dep.model else None,
                "model_identity": engine.key_parts.get("model_sha256"),
                "engine_version": engine.key_parts.get("engine_version"),
                "options": numerics_options(dep.engine, dep.options), **extra["judge"],
                "sampling": settings.sampling.model_dump(mode="json")}
    identity_sha = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    where = run.path / JUDGE_DIR
    path = where / JUDGEMENTS
    done = {r["key"] for r in read_jsonl(path) if r.get("identity_sha256") == identity_sha} if path.exists() else set()
    if path.exists() and any(r.get("identity_sha256") != identity_sha for r in read_jsonl(path)):
        print(f"evalkit: judge: {path} holds another judge's answers; they are replaced", file=sys.stderr)
        path.unlink()
        done = set()
    pending = [c for c in calls if c.key not in done]
    print(f"evalkit: judge {dep.name}: {len(pending)} of {len(calls)} judge calls to make", file=sys.stderr, flush=True)
    try:
        writer = RecordWriter(path)
        for pass_ in sorted({c.pass_ for c in pending}):
            for batch in _batches([c for c in pending if c.pass_ == pass_]):
                by_key = {c.key: c for c in batch}
                requests = [GenRequest(key=c.key, prompt=c.text, chat=True) for c in batch]
                recs = [_record(by_key[r.key], r.output_text, r.cached, r.measured_at, identity_sha)
                        for r in engine.generate(requests, _sampling(settings, pass_))]
                writer.write_batch(recs)
    finally:
        stats = engine.run_stats() if hasattr(engine, "run_stats") else {}
        cost = {"calls": engine.stats.misses, "cache_hits": engine.stats.hits,
                "engine_loaded": bool(getattr(engine.inner, "is_loaded", True)), **{k: v for k, v in stats.items() if k == "loads"}}
        engine.close()
    info = {"identity": identity, "identity_sha256": identity_sha, "settings": settings.model_dump(mode="json"),
            "rubrics_dir": str(rubrics), "reference": reference, "resolved": {k: v for k, v in resolved.items() if k != "hardware"},
            "last_judging": cost, "n_calls": len(calls),
            # Each judged deployment's model (its source, or a served model's id): the same-family flag reads it.
            "judged_sources": {d: e.get("source") or e.get("endpoint") or d
                               for d, e in (manifest.get("deployments") or {}).items() if isinstance(e, dict)}}
    atomic_write_text(where / JUDGE_JSON, json.dumps(info, indent=2, default=str) + "\n")
    manifest = run.manifest()
    manifest["judge"] = {"identity": identity, "identity_sha256": identity_sha}
    run.write_manifest(manifest)
    return cost


def judge_settings_of(run: RunDir, judge_config: Path | None) -> tuple[JudgeSettings, Path | None]:
    """The judge to use: the `judge:` block of the given YAML file (a whole config or only that block), else of
    the run's own config. A missing or invalid block is one line naming the file."""
    import yaml
    from pydantic import ValidationError

    from evalkit.config import explain_validation_error
    from evalkit.errors import ConfigError

    if judge_config is None:
        manifest = run.manifest()
        config = Config.model_validate(manifest["config"])
        if config.judge is None:
            raise ConfigError(str(run.manifest_path), "the run's config has no `judge:` block; give one with --config")
        return config.judge, Path(manifest["config_file"])
    try:
        raw = yaml.safe_load(Path(judge_config).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(str(judge_config), f"cannot read it as YAML ({type(e).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("judge"), dict):
        raise ConfigError(str(judge_config), "no `judge:` block (which deployment grades the outputs)")
    try:
        return JudgeSettings.model_validate(raw["judge"]), Path(judge_config)
    except ValidationError as e:
        raise ConfigError(str(judge_config), explain_validation_error(e, raw["judge"], JudgeSettings, ("judge",))) from None


def judge_summary(run_dir: Path) -> dict[str, Any] | None:
    """`judge/judge.json` of a run, None when it was never judged."""
    path = Path(run_dir) / JUDGE_DIR / JUDGE_JSON
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


