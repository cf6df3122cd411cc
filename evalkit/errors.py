"""Errors a user can cause. Each prints as one line and exits with code 2."""
from __future__ import annotations

EXIT_USER_ERROR = 2


class EvalkitError(Exception):
    """A mistake in the user's input: one clear line, no traceback, exit 2."""

    def __init__(self, source: str | None, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}" if source else problem)

    def __reduce__(self) -> tuple[type[EvalkitError], tuple[str | None, str]]:
        # Picklable with its two fields (a Ray task's error crosses processes to the driver).
        return (self.__class__, (self.source, self.problem))


class ConfigError(EvalkitError):
    """The config file is missing, unreadable, or does not match the schema."""


class DataError(EvalkitError):
    """A prompt file, dataset or text is missing or malformed."""


class ModelFileError(EvalkitError):
    """A model file is missing, not the format it claims, or corrupt."""


class RatingSheetError(EvalkitError):
    """A rating sheet failed validation; nothing from it was imported."""


class EngineUnavailableError(EvalkitError):
    """The engine a deployment asks for is not installed on this machine."""


class RunDirError(EvalkitError):
    """A run directory is missing or is not an evalkit run."""


class VariantError(EvalkitError):
    """A model variant (hf, fp8-weight, GGUF ladder) cannot be made from its source."""
