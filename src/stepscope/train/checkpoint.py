"""Checkpoints: written atomically, read with ``weights_only=True``.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one: a crash or a full disk mid-write leaves the previous checkpoint intact, never a
half-written file (rename within one filesystem is atomic).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stepscope.atomic import atomic_open
from stepscope.errors import ModelError


@dataclass
class CheckpointWrite:
    path: Path
    bytes: int
    seconds: float


def save_checkpoint(state: dict[str, Any], path: Path) -> CheckpointWrite:
    """Write ``state`` to ``path`` atomically; returns its size and how long it took."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # fsync: after a crash or power loss last.pt is the old checkpoint or the new one, whole.
    with atomic_open(path, "wb", fsync=True) as fh:
        torch.save(state, fh)
    return CheckpointWrite(path, path.stat().st_size, time.perf_counter() - t0)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a stepscope checkpoint (tensors and plain Python values only)."""
    if not Path(path).is_file():
        raise ModelError(f"no checkpoint at {path}: expected a file such as RUN/checkpoints/best.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelError(f"{path} is not a readable stepscope checkpoint: {exc}") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise ModelError(f"{path} holds no 'model' state: is it a stepscope checkpoint?")
    return state
