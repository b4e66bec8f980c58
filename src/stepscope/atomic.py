"""Atomic file writes: the one helper every layer uses to write a run's files.

A reader (a browser on ``report.html``, ``compare`` on ``summary.json``, ``--resume`` on
``last.pt``) must never see half a file, and a write that fails (full disk, Ctrl-C) must leave
the previous file as it was. So the bytes go to a uniquely named temporary file in the target's
own directory (a rename is only atomic within one file system), which then replaces the
target with ``os.replace``; on any error the temporary file is removed.

Like ``policy.py`` this module sits below every layer and imports nothing from stepscope.

Examples:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> atomic_write_text(d / "a.txt", "hello").read_text()
    'hello'
    >>> with atomic_open(d / "b.csv", "w", newline="") as fh:
    ...     _ = fh.write("x,y\\n")
    >>> sorted(p.name for p in d.iterdir())
    ['a.txt', 'b.csv']
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_DEFAULT_MODE = 0o644


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", *, encoding: str | None = None,
                newline: str | None = None, fsync: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path``.

    Args:
        path: the file to (re)place; its directory is created when missing.
        mode: ``"w"`` (text, UTF-8 unless ``encoding`` says otherwise) or ``"wb"``.
        encoding: text encoding (text mode only).
        newline: passed to ``open`` (``""`` for the csv module).
        fsync: flush the bytes to the device before the rename, so that after a power loss
            the file is the old one or the whole new one (checkpoints); costs a disk flush.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file private (0600); a run's files are as readable as any other.
        with contextlib.suppress(OSError):
            os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else _DEFAULT_MODE)
        text = mode == "w"
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if text else None,
                       newline=newline if text else None) as fh:
            yield fh
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "w", encoding=encoding) as fh:
        fh.write(text)
    return Path(path)


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_open(path, "wb", fsync=fsync) as fh:
        fh.write(data)
    return Path(path)


__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text"]
