"""Suite registry: the config key under `suites:` -> the module attribute holding its `SuiteSpec`.

Everything outside evalkit/suites/ learns about a suite from its spec (evalkit/suites/spec.py): config
validates `suites.<name>` with its settings model, records parse with its record types, the metric
declarations, preflight, scoring, the report and the viewer read it. Adding a suite = one module with a
`SPEC` plus one line here. Specs load lazily (importing the suite's module) when first asked for.
"""
from __future__ import annotations

import difflib
import importlib
import os
from functools import lru_cache
from typing import Any

from evalkit.suites.spec import DiskNeed, ItemCell, SuiteSpec, ViewerSpec

__all__ = ["SUITES", "DiskNeed", "ItemCell", "SuiteSpec", "ViewerSpec", "all_specs", "enabled_suites", "load_hook",
           "rated_suite", "run_suite_names", "scored_suites", "suite_class", "suite_names", "suite_spec",
           "unknown_suite_message", "workload_suite"]

# Order matters: it is the order suites run inside a worker and appear in the report.
SUITES: dict[str, str] = {
    "prompts": "evalkit.suites.prompts:SPEC",
    "perplexity": "evalkit.suites.perplexity:SPEC",
    "mmlu": "evalkit.suites.mmlu:SPEC",
    "longcontext": "evalkit.suites.longcontext:SPEC",
    "humaneval": "evalkit.suites.code:SPEC",
    "cost": "evalkit.suites.cost:SPEC",
    "ratings": "evalkit.suites.ratings:SPEC",  # not run: imported human ratings (SuiteSpec.runs False)
    "judge": "evalkit.suites.judge:SPEC",  # not run: a model judge's answers
}
# Suites kept outside evalkit: `EVALKIT_SUITES="name=module:SPEC,..."` registers them after these (a worker
# inherits the variable, so a run's every process knows them).
SUITES.update(dict(entry.strip().split("=", 1) for entry in os.environ.get("EVALKIT_SUITES", "").split(",") if "=" in entry))


def suite_names() -> list[str]:
    return list(SUITES)


def run_suite_names() -> list[str]:
    """The suites that run (SuiteSpec.runs), in registry order: the ones a config can name under `suites:`."""
    return [spec.name for spec in all_specs() if spec.runs]


def unknown_suite_message(name: Any) -> str:
    names = run_suite_names()
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown suite {name!r}{hint} (suites: {', '.join(names)})"


@lru_cache(maxsize=None)
def _load_spec(target: str) -> SuiteSpec:
    module, _, attr = target.partition(":")
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, SuiteSpec):
        raise TypeError(f"{target} is not a SuiteSpec")
    return spec


def suite_spec(name: str) -> SuiteSpec:
    """The spec of a registered suite; KeyError (with the registered names) for an unknown one."""
    if name not in SUITES:
        raise KeyError(unknown_suite_message(name))
    spec = _load_spec(SUITES[name])
    if spec.name != name:
        raise TypeError(f"{SUITES[name]} declares suite {spec.name!r}, registered as {name!r}")
    return spec


def all_specs() -> list[SuiteSpec]:
    """Every registered suite's spec, in registry order."""
    return [suite_spec(name) for name in SUITES]


def registry_state() -> tuple[tuple[str, str], ...]:
    """What the registry holds now: tables derived from every spec (record types, metric declarations) are kept
    per state, so a suite registered later (a test's stub) is seen."""
    return tuple(SUITES.items())


@lru_cache(maxsize=None)
def load_hook(target: str) -> Any:
    """The function a spec names as "module:function" (its report section, verdict columns, ...), imported by name:
    presentation lives above the suites' layer, so a spec names it instead of importing it."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def suite_class(name: str) -> type:
    """The suite's class (an evalkit.suites.base.Suite subclass)."""
    return suite_spec(name).suite_class


def rated_suite() -> str | None:
    """The suite whose generated outputs humans rate and the model judge grades (SuiteSpec.rated_outputs)."""
    return next((spec.name for spec in all_specs() if spec.rated_outputs), None)


def workload_suite() -> SuiteSpec | None:
    """The suite whose metrics are a workload's limits (SuiteSpec.quality False), which the decision reads."""
    return next((spec for spec in all_specs() if not spec.quality), None)


def scored_suites(config: Any, config_file: Any) -> list[Any]:
    """What scoring asks for rows, in registry order: every suite the config switches on, and every suite scored from
    the run directory's own files (SuiteSpec.runs False: imported ratings, a judge's answers), which no config names."""
    out = []
    for name in SUITES:
        spec = suite_spec(name)
        settings = config.suites.get(name) if spec.runs else spec.settings_model()
        if settings is not None:
            out.append(spec.suite_class(settings, config, config_file))
    return out


def enabled_suites(config: Any, config_file: Any) -> list[Any]:
    """Instantiate every suite the config switches on, in registry order (evalkit.suites.base.Suite objects)."""
    out = []
    for name in SUITES:
        settings = config.suites.get(name)
        if settings is not None:
            out.append(suite_class(name)(settings, config, config_file))
    return out
