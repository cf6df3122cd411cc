"""Engine registry: engine name in config -> the module attribute holding its `EngineSpec`.

Importing a spec never imports the engine library (specs load lazily), so an absent engine costs nothing
and `evalkit.config` validates every engine's options without any of them installed.
"""
from __future__ import annotations

import difflib
import importlib
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from evalkit.engines.spec import SERVED_KIND, Capability, DoctorRow, EngineSpec, UnitResources
from evalkit.errors import EngineUnavailableError

if TYPE_CHECKING:
    from evalkit.engines.base import Engine

__all__ = ["ENGINES", "SERVED_KIND", "Capability", "DoctorRow", "EngineSpec", "UnitResources", "engine_spec", "engine_names", "load_engine", "unknown_engine_message",
           "format_problem", "numeric_settings"]

ENGINES: dict[str, str] = {
    "llamacpp": "evalkit.engines.llamacpp:SPEC",
    "vllm": "evalkit.engines.vllm:SPEC",
    "hf": "evalkit.engines.hf:SPEC",
    "openai": "evalkit.engines.openai:SPEC",
}


def engine_names() -> list[str]:
    return list(ENGINES)


def unknown_engine_message(name: Any) -> str:
    close = difflib.get_close_matches(str(name), list(ENGINES), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown engine {name!r} (registered: {', '.join(ENGINES)}){hint}"


@lru_cache(maxsize=None)
def _load_spec(target: str) -> EngineSpec:
    module, _, attr = target.partition(":")
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, EngineSpec):
        raise TypeError(f"{target} is not an EngineSpec")
    return spec


def engine_spec(name: str) -> EngineSpec:
    """The spec of a registered engine; KeyError (with the registered names) for an unknown one."""
    if name not in ENGINES:
        raise KeyError(unknown_engine_message(name))
    return _load_spec(ENGINES[name])


def gives_full_distributions(engine: str) -> bool:
    """Whether the registered engine gives full next-token distributions (exact KLD can be measured on it)."""
    return Capability.FULL_DISTRIBUTION in engine_spec(engine).capabilities


def load_engine(engine: str, model_path: str | None, options: Any, deployment: str) -> "Engine":
    """Load `model_path` with the named engine and options (its spec's options model); None: a served model
    whose weights are not named."""
    try:
        spec = engine_spec(engine)
    except KeyError:
        raise EngineUnavailableError(f"deployment {deployment}", unknown_engine_message(engine)) from None
    try:
        return spec.loader(model_path, options)
    except ImportError as e:
        raise EngineUnavailableError(
            f"deployment {deployment}", f"engine {engine!r} is not installed ({e.name}); {spec.install_hint}"
        ) from None


def format_problem(name: str) -> str | None:
    """Why no registered engine runs a weight-quantization format name (each engine's `EngineSpec.format_problem`;
    the first refusal), or None when one that declares formats takes it (or none declares any)."""
    problems = [spec.format_problem(name) for spec in (engine_spec(n) for n in ENGINES) if spec.format_problem is not None]
    return None if not problems or None in problems else problems[0]


def numeric_settings(extra: dict[str, Any]) -> dict[str, Any]:
    """The settings an engine info's `extra` states that change greedy outputs (every registered engine's
    `EngineSpec.info_numerics`, in registry order), name -> value. "a.b" is read as key b of the dict at key a
    and named b; a top-level b wins."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(k for n in ENGINES for k in engine_spec(n).info_numerics):
        head, _, key = name.rpartition(".")
        inner = extra.get(head) if head else None
        if key in extra:
            out[key] = extra[key]
        elif isinstance(inner, dict) and key in inner:
            out[key] = inner[key]
    return out
