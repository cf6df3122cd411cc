"""Every mistake in a run's inputs, found before anything is written.

`preflight(config, config_file)` reads and validates all the data the enabled suites will use (their data
files line by line, texts, fillers, question folders) and runs each suite's own plan-time checks
(`SuiteSpec.check`: rubrics, chunk lengths against the deployments' contexts, ...). The
first problem is raised as one `EvalkitError` line naming the file (and line) and the problem, which the
command line prints and turns into exit code 2 *before* the run directory exists. A worker that found the
same problem later would leave an empty run directory and print it once per deployment.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.config import Config
from evalkit.errors import ConfigError, DataError
from evalkit.suites import enabled_suites, run_suite_names, suite_spec
from evalkit.suites.base import Suite


def preflight(config: Config, config_file: Path) -> dict[str, dict[str, Any]]:
    """Validate every enabled suite's data; returns each suite's provenance (`describe()`) for the manifest."""
    check_formats(config, config_file)
    suites = enabled_suites(config, config_file)
    if not suites:
        raise ConfigError(str(config_file), f"no suite is enabled; enable at least one under 'suites:' ({', '.join(run_suite_names())})")
    described: dict[str, dict[str, Any]] = {}
    for suite in suites:
        items = suite.items()  # parses the data files: prompt lines, MMLU csv/jsonl, HumanEval tasks, ...
        described[suite.name] = suite.describe()  # reads (and hashes) the rest: texts, fillers
        _check_suite(suite, items, config, config_file)
    _check_gpu(config, config_file)
    return described


def check_formats(config: Config, config_file: Path) -> None:
    """Each engine's plan-time check of a deployment's local files (`EngineSpec.plan_check`: a quantization format
    its kernels do not take, a group size that does not divide the model's layers, ...): the first problem, one line."""
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        check = engine_spec(dep.engine).plan_check
        problem = check(dep, config_file) if check is not None else None
        if problem:
            raise ConfigError(str(config_file), problem)


def _check_gpu(config: Config, config_file: Path) -> None:
    """A deployment its engine refuses on this machine's GPU (vLLM FP8 below its minimum capability, bfloat16
    on a V100, float16 for Gemma 3, ...) fails here, in one line, not when its worker starts."""
    from evalkit.gpu_plan import refusals_here

    errors = refusals_here(config, config_file)
    if errors:
        raise errors[0]


def _check_suite(suite: Suite[Any], items: list[Any], config: Config, config_file: Path) -> None:
    """The suite's own plan-time checks (`SuiteSpec.check`); a suite without one must select some items."""
    check = suite_spec(suite.name).check
    if check is not None:
        check(suite, items, config, config_file)
    elif not items:
        raise DataError(f"suites.{suite.name}", "selects no items (check its data and limits)")


def check_engines(config: Config) -> None:
    """Each engine's own plan-time checks of its deployments (`EngineSpec.check`: e.g. a server that must
    answer), before anything else asks about a deployment (capabilities, suite data)."""
    from evalkit.engines import engine_spec

    for dep in config.deployments:
        check = engine_spec(dep.engine).check
        if check is not None:
            check(dep)
