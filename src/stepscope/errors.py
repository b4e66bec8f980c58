"""Errors a user can cause. Every layer may raise these; the CLI prints them without a traceback."""

from __future__ import annotations


class StepscopeError(Exception):
    """A problem the user can fix: the message says what was found, what was expected, what to do."""


class DataError(StepscopeError):
    """Bad dataset input: missing column, missing file, path escaping the image folder, ..."""


class ModelError(StepscopeError):
    """Unknown model name, weights not reachable offline, incompatible checkpoint."""


class StoreError(StepscopeError):
    """A run directory or run database that cannot be read."""
