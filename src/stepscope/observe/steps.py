"""The step timer: splits every step into data wait, host-to-device copy, compute and the rest.

A step runs from the moment the loop asks the loader for a batch to the moment it asks for the
next one, so ``data_wait_s + transfer_s + compute_s + other_s == wall_s`` holds by construction
on the CPU. On a GPU the copy and compute regions only *launch* work; what they cost is read
from CUDA events recorded around them, resolved lazily once the GPU has passed them (``query()``),
so timing never adds a ``synchronize()`` per step. The CPU-side wall time stays the frame; the
GPU parts are fitted into it (see :meth:`StepTimer._fit_gpu_parts`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepscope.store.records import StepRecord


class GpuEvent(Protocol):
    """The subset of ``torch.cuda.Event`` the timer uses (a fake stands in for it in tests)."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


@dataclass
class OpenStep:
    """The step being timed right now (the loop body between two loader calls)."""

    phase_id: int
    step: int
    t_start: float
    data_wait_s: float
    images: int
    warmup: bool
    transfer_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    loss: float | None = None
    gpu_pairs: list[tuple[str, GpuEvent, GpuEvent]] = field(default_factory=list)


@dataclass
class StepTimer:
    """Times steps; hands finished :class:`StepRecord` s to ``emit``.

    Examples:
        >>> records = []
        >>> timer = StepTimer(emit=records.append)
        >>> timer.begin(phase_id=0, step=0, t_start=0.0, data_wait_s=0.1, images=8, warmup=False)
        >>> with timer.part("compute"):
        ...     pass
        >>> timer.end(t_end=0.5)
    """

    emit: Callable[[StepRecord], None]
    clock: Callable[[], float] = time.perf_counter
    wall_clock: Callable[[], float] = time.time
    event_factory: Callable[[], GpuEvent] | None = None
    current: OpenStep | None = None
    _pending: deque[tuple[StepRecord, list[tuple[str, GpuEvent, GpuEvent]]]] = field(
        default_factory=deque
    )
    _clock_offset: float = 0.0

    def __post_init__(self) -> None:
        # Steps are timed with a monotonic clock; records carry Unix time so they line up
        # with the sampler's series.
        self._clock_offset = self.wall_clock() - self.clock()

    def begin(
        self, *, phase_id: int, step: int, t_start: float, data_wait_s: float, images: int,
        warmup: bool,
    ) -> None:
        self.current = OpenStep(phase_id, step, t_start, data_wait_s, images, warmup)

    @contextmanager
    def part(self, kind: str) -> Iterator[None]:
        """Time a region of the current step as ``transfer``, ``compute`` or ``comm``."""
        step = self.current
        if step is None:  # outside a monitored loader: nothing to attribute it to
            yield
            return
        pair = self._record_start()
        t0 = self.clock()
        try:
            yield
        finally:
            dt = self.clock() - t0
            if pair is not None:
                pair[1].record()
                step.gpu_pairs.append((kind, pair[0], pair[1]))
            setattr(step, f"{kind}_s", getattr(step, f"{kind}_s") + dt)

    def _record_start(self) -> tuple[GpuEvent, GpuEvent] | None:
        if self.event_factory is None:
            return None
        start, end = self.event_factory(), self.event_factory()
        start.record()
        return start, end

    def end(self, t_end: float) -> None:
        """Close the current step at ``t_end`` (the start of the next data wait)."""
        step = self.current
        if step is None:
            return
        self.current = None
        wall = max(t_end - step.t_start, 0.0)
        rec = StepRecord(
            phase_id=step.phase_id, step=step.step, t_start=step.t_start + self._clock_offset,
            wall_s=wall, data_wait_s=step.data_wait_s, transfer_s=step.transfer_s,
            compute_s=step.compute_s, comm_s=step.comm_s, other_s=0.0, images=step.images,
            warmup=step.warmup, loss=step.loss,
        )
        if step.gpu_pairs:
            self._pending.append((rec, step.gpu_pairs))
            self.resolve(block=False)
        else:
            self._emit(rec)

    def resolve(self, block: bool) -> None:
        """Emit steps whose GPU events have completed; with ``block`` wait for all of them.

        Called once per step (non-blocking: ``query()`` never waits) and at phase end, where
        one wait for the last events is the only synchronisation timing adds.
        """
        while self._pending:
            rec, pairs = self._pending[0]
            if not block and not all(end.query() for _, _, end in pairs):
                return
            self._pending.popleft()
            gpu: dict[str, float] = {}
            for kind, start, end in pairs:
                if block:
                    _synchronize(end)
                gpu[kind] = gpu.get(kind, 0.0) + start.elapsed_time(end) / 1000.0
            self._fit_gpu_parts(rec, gpu)
            self._emit(rec)

    @staticmethod
    def _fit_gpu_parts(rec: StepRecord, gpu: dict[str, float]) -> None:
        # The GPU runs behind the CPU: a part's GPU time can exceed the CPU time spent
        # launching it. Take the GPU's figure, but never more than the step's wall time
        # leaves after the data wait, so the parts still add up to the wall time.
        room = max(rec.wall_s - rec.data_wait_s, 0.0)
        for kind in ("transfer", "compute", "comm"):
            if kind in gpu:
                value = min(gpu[kind], room)
                setattr(rec, f"{kind}_s", value)
                room -= value

    def _emit(self, rec: StepRecord) -> None:
        parts = rec.data_wait_s + rec.transfer_s + rec.compute_s + rec.comm_s
        rec.other_s = max(rec.wall_s - parts, 0.0)
        self.emit(rec)


def _synchronize(event: GpuEvent) -> None:
    sync = getattr(event, "synchronize", None)
    if sync is not None:
        sync()
