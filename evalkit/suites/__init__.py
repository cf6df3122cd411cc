"""Suite registry: the config key under `suites:` -> the class that runs it (imported lazily)."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evalkit.suites.base import Suite

# Order matters: it is the order suites run inside a worker and appear in the report.
SUITES: dict[str, str] = {
    "prompts": "evalkit.suites.prompts:PromptsSuite",
    "perplexity": "evalkit.suites.perplexity:PerplexitySuite",
    "mmlu": "evalkit.suites.mmlu:MmluSuite",
    "longcontext": "evalkit.suites.longcontext:LongContextSuite",
    "humaneval": "evalkit.suites.code:HumanEvalSuite",
    "cost": "evalkit.suites.cost:CostSuite",
}


def suite_class(name: str) -> "type[Suite]":
    module, _, cls = SUITES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def enabled_suites(config, config_file) -> "list[Suite]":  # type: ignore[no-untyped-def]
    """Instantiate every suite the config switches on, in registry order."""
    out = []
    for name in SUITES:
        settings = getattr(config.suites, name, None)
        if settings is not None:
            out.append(suite_class(name)(settings, config, config_file))
    return out
