"""Errors a user can cause. Every layer may raise these; the CLI prints them without a traceback."""

from __future__ import annotations

import errno


class StepscopeError(Exception):
    """A problem the user can fix: the message says what was found, what was expected, what to do."""


class DataError(StepscopeError):
    """Bad dataset input: missing column, missing file, path escaping the image folder, ..."""


class ModelError(StepscopeError):
    """Unknown model name, weights not reachable offline, incompatible checkpoint."""


class StoreError(StepscopeError):
    """A run directory or run database that cannot be read."""


class DiskError(StepscopeError):
    """A write failed because of the disk itself: full, over quota, read-only, failing."""


# errno -> what it says about the disk. Anything else is not the disk's fault and is re-raised.
_DISK_ERRNOS = {
    errno.ENOSPC: "is full",
    errno.EDQUOT: "is over its quota",
    errno.EROFS: "is read-only",
    errno.EIO: "reported an I/O error",
}


def disk_error(exc: OSError, what: str, advice: str) -> DiskError | None:
    """A one-line :class:`DiskError` for ``exc`` when the disk caused it, else None.

    Examples:
        >>> e = disk_error(OSError(28, "No space left on device"), "runs/a/last.pt", "free space")
        >>> str(e)
        'the disk holding runs/a/last.pt is full (No space left on device) while writing runs/a/last.pt; free space'
    """
    reason = _DISK_ERRNOS.get(exc.errno or -1)
    if reason is None:
        return None
    return DiskError(f"the disk holding {exc.filename or what} {reason} ({exc.strerror}) "
                     f"while writing {what}; {advice}")
