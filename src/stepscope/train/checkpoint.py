"""Checkpoints: written atomically with their SHA-256 beside them, read with
``weights_only=True`` after the digest is checked.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one: a crash or a full disk mid-write leaves the previous checkpoint intact, never a
half-written file (rename within one filesystem is atomic).
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stepscope.atomic import atomic_open, atomic_write_text
from stepscope.errors import ModelError


@dataclass
class CheckpointWrite:
    path: Path
    bytes: int
    seconds: float


# free-form: torch state dicts and what the trainer keeps beside them
def save_checkpoint(state: dict[str, Any], path: Path) -> CheckpointWrite:
    """Write ``state`` to ``path`` atomically; returns its size and how long it took."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # The checkpoint and its digest are two renames: an interrupt between them would leave a
    # digest of the old file beside the new one, and the next load would refuse it. Ctrl-C and
    # SIGTERM wait until both are written (a few seconds at most), then act as they would have.
    with _signals_deferred():
        # fsync: after a crash or power loss last.pt is the old checkpoint or the new one, whole.
        try:
            with atomic_open(path, "wb", fsync=True) as fh:
                torch.save(state, fh)
        except RuntimeError as exc:
            # A full disk inside torch.save: its zip writer's cleanup then fails too and
            # reports that instead. What the caller must see is the disk's error.
            cause = exc.__context__
            if isinstance(cause, (KeyboardInterrupt, OSError)):
                raise cause from None
            raise
        # The digest beside it lets a later load tell a file changed since (tampered, or
        # damaged on disk) from the one written here; the page cache serves this read.
        atomic_write_text(_digest_path(path), f"{_sha256(path)}  {path.name}\n")
    return CheckpointWrite(path, path.stat().st_size, time.perf_counter() - t0)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block, then deliver the first one that came, to the
    handlers that were there before. Only the main thread can set handlers: elsewhere the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    wanted = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in wanted}
    for s in wanted:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if held:
        signal.raise_signal(held[0])


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_digest(path: Path) -> None:
    """Refuse a checkpoint whose bytes differ from those its writer recorded (if it did)."""
    try:
        recorded = _digest_path(path).read_text().split()[0]
    except (OSError, IndexError):
        return  # written before digests, or copied without one: weights_only still guards
    actual = _sha256(path)
    if actual != recorded:
        raise ModelError(
            f"{path} refused: its SHA-256 ({actual[:12]}...) differs from the one recorded when "
            f"it was written ({recorded[:12]}... in {_digest_path(path).name}); the file was "
            "changed or damaged since. Use another checkpoint, or delete the .sha256 file to "
            "load it anyway")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a stepscope checkpoint (tensors and plain Python values only)."""
    if not Path(path).is_file():
        raise ModelError(f"no checkpoint at {path}: expected a file such as RUN/checkpoints/best.pt")
    _check_digest(Path(path))
    try:
        # weights_only: the unpickler builds tensors and plain values only, so a checkpoint
        # that was swapped for a malicious pickle is refused instead of running its code.
        with warnings.catch_warnings():
            # A foreign pickle makes torch warn about its protocol before refusing it.
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message goes on to suggest weights_only=False: exactly what must not happen.
        found = re.search(r"GLOBAL ([\w.]+)|WeightsUnpickler error:\s*(.+)", str(exc))
        detail = (found.group(1) or found.group(2) or "").strip()[:120] if found else ""
        what = f" ({detail})" if detail else ""
        raise ModelError(
            f"{path} refused: it holds Python objects other than tensors and plain values{what}; "
            "it was tampered with or not written by stepscope, and is not loaded (loading it "
            "could run code)") from exc
    except Exception as exc:
        raise ModelError(f"{path} is not a readable stepscope checkpoint (corrupt, truncated or "
                         f"another format: {_first_line(exc)})") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise ModelError(f"{path} holds no 'model' state: is it a stepscope checkpoint?")
    return state


def _first_line(exc: BaseException) -> str:
    """torch's load errors run to many lines of advice; the first says what went wrong."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(exc).__name__
