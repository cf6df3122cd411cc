"""Every mistake in a run's inputs, found before anything is written.

`preflight(config, config_file)` reads and validates all the data the enabled suites will use (prompt
files line by line, the perplexity text, the long-context filler, the MMLU folder, the HumanEval file,
the rating rubrics of the prompt categories) and checks what can be checked across config sections. The
first problem is raised as one `EvalkitError` line naming the file (and line) and the problem, which the
command line prints and turns into exit code 2 *before* the run directory exists. A worker that found the
same problem later would leave an empty run directory and print it once per deployment.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.config import Config
from evalkit.errors import ConfigError, DataError
from evalkit.suites import SUITES, enabled_suites
from evalkit.suites.base import Suite


def preflight(config: Config, config_file: Path) -> dict[str, dict[str, Any]]:
    """Validate every enabled suite's data; returns each suite's provenance (`describe()`) for the manifest."""
    suites = enabled_suites(config, config_file)
    if not suites:
        raise ConfigError(str(config_file), f"no suite is enabled; enable at least one under 'suites:' ({', '.join(SUITES)})")
    described: dict[str, dict[str, Any]] = {}
    for suite in suites:
        items = suite.items()  # parses the data files: prompt lines, MMLU csv/jsonl, HumanEval tasks, ...
        described[suite.name] = suite.describe()  # reads (and hashes) the rest: texts, fillers
        _check_suite(suite, items, config, config_file)
    _check_rubrics(config)
    _check_gpu(config, config_file)
    return described


def _check_gpu(config: Config, config_file: Path) -> None:
    """A deployment its engine refuses on this machine's GPU (vLLM FP8 below its minimum capability, bfloat16
    on a V100, float16 for Gemma 3, ...) fails here, in one line, not when its worker starts."""
    from evalkit.gpu_plan import refusals_here

    errors = refusals_here(config, config_file)
    if errors:
        raise errors[0]


def _check_suite(suite: Suite, items: list[Any], config: Config, config_file: Path) -> None:
    if suite.name == "perplexity":
        _check_perplexity(suite, items, config, config_file)
    elif not items:
        raise DataError(f"suites.{suite.name}", "selects no items (check its data and limits)")


def _check_perplexity(suite: Suite, items: list[Any], config: Config, config_file: Path) -> None:
    n_ctx = suite.settings.n_ctx
    if not items:
        # A token covers at least one byte (+2 for BOS and a space prefix): fewer bytes can't fill one chunk.
        path = resolve_text(suite)
        raise DataError(str(path), f"perplexity text is too short for one chunk of n_ctx={n_ctx} tokens")
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        if not dep.runs(suite.name):
            continue
        spec = engine_spec(dep.engine)
        context = spec.context_of(dep.options)
        if context and n_ctx > context:
            raise ConfigError(
                str(config_file),
                f"suites.perplexity.n_ctx={n_ctx} exceeds deployment {dep.name}'s context ({context} tokens, "
                f"options.{spec.context_option})",
            )


def resolve_text(suite: Suite) -> Path:
    from evalkit.config import resolve_data_path

    return resolve_data_path(suite.settings.text, suite.config_file)


def check_engines(config: Config) -> None:
    """Each engine's own plan-time checks of its deployments (`EngineSpec.check`: e.g. a server that must
    answer), before anything else asks about a deployment (capabilities, suite data)."""
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        check = engine_spec(dep.engine).check
        if check is not None:
            check(dep)


def _check_rubrics(config: Config) -> None:
    """Blind rating sheets quote each prompt category's rubric: a missing one would surface only at export."""
    prompts = config.suites.prompts
    if prompts is None:
        return
    from evalkit.rating.export import rubric_summary

    for category in [*prompts.categories, "pairwise"]:
        rubric_summary(category)
