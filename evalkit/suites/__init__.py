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

from evalkit.suites.spec import ItemCell, SuiteSpec, ViewerSpec

__all__ = ["SUITES", "ItemCell", "SuiteSpec", "ViewerSpec", "all_specs", "enabled_suites", "load_hook", "suite_class", "suite_names",
           "suite_spec", "unknown_suite_message"]

# Order matters: it is the order suites run inside a worker and appear in the report.
SUITES: dict[str, str] = {
    "prompts": "evalkit.suites.prompts:SPEC",
    "perplexity": "evalkit.suites.perplexity:SPEC",
    "mmlu": "evalkit.suites.mmlu:SPEC",
    "longcontext": "evalkit.suites.longcontext:SPEC",
    "humaneval": "evalkit.suites.code:SPEC",
    "cost": "evalkit.suites.cost:SPEC",
}
# Suites kept outside evalkit: `EVALKIT_SUITES="name=module:SPEC,..."` registers them after these (a worker
# inherits the variable, so a run's every process knows them).
SUITES.update(dict(entry.strip().split("=", 1) for entry in os.environ.get("EVALKIT_SUITES", "").split(",") if "=" in entry))


def suite_names() -> list[str]:
    return list(SUITES)


def unknown_suite_message(name: Any) -> str:
    close = difflib.get_close_matches(str(name), list(SUITES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown suite {name!r}{hint} (suites: {', '.join(SUITES)})"


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


def enabled_suites(config: Any, config_file: Any) -> list[Any]:
    """Instantiate every suite the config switches on, in registry order (evalkit.suites.base.Suite objects)."""
    out = []
    for name in SUITES:
        settings = config.suites.get(name)
        if settings is not None:
            out.append(suite_class(name)(settings, config, config_file))
    return out
