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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stepscope.store.records import StepRecord


class GpuEvent(Protocol):
    """The subset of ``torch.cuda.Event`` the timer uses (a fake stands in for it in tests)."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


@dataclass(slots=True)
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
    # Allocated by the first GPU-timed part only: a list per step would cost on the CPU path.
    gpu_pairs: list[tuple[str, GpuEvent, GpuEvent]] | None = None


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
    # Takes the CPU path's steps as rows in ``StepRecord`` field order instead: a tuple costs a
    # twentieth of a dataclass, and this runs once per step of every instrumented loop.
    emit_row: Callable[[tuple[Any, ...]], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    wall_clock: Callable[[], float] = time.time
    event_factory: Callable[[], GpuEvent] | None = None
    current: OpenStep | None = None
    _pending: deque[tuple[StepRecord, list[tuple[str, GpuEvent, GpuEvent]]]] = field(
        default_factory=deque
    )
    _clock_offset: float = 0.0
    _parts: dict[str, _Part] = field(default_factory=dict)
    _spare: OpenStep | None = None  # the last CPU step, reused by :meth:`open`

    def __post_init__(self) -> None:
        # Steps are timed with a monotonic clock; records carry Unix time so they line up
        # with the sampler's series.
        self._clock_offset = self.wall_clock() - self.clock()

    def begin(
        self, *, phase_id: int, step: int, t_start: float, data_wait_s: float, images: int,
        warmup: bool,
    ) -> None:
        self.open(phase_id, step, t_start, data_wait_s, images, warmup)

    def open(self, phase_id: int, step: int, t_start: float, data_wait_s: float, images: int,
             warmup: bool) -> None:
        """:meth:`begin` without keywords, for the loader's hot path.

        The step object of the last CPU-timed step is reset and reused: building one costs about
        a microsecond, half this timer's budget per step.
        """
        s = self._spare
        if s is None:
            self.current = OpenStep(phase_id, step, t_start, data_wait_s, images, warmup)
            return
        self._spare = None
        s.phase_id, s.step, s.t_start, s.data_wait_s, s.images, s.warmup = (
            phase_id, step, t_start, data_wait_s, images, warmup)
        s.transfer_s = s.compute_s = s.comm_s = 0.0
        s.loss = None
        self.current = s

    def cpu_step(self) -> tuple[OpenStep, Callable[[tuple[Any, ...]], None]] | None:
        """An open step and the row sink, for a loader that opens and closes its CPU steps
        itself (see :meth:`close_cpu`); None when steps must take :meth:`open`/:meth:`end`
        (GPU events to resolve later, or no row sink yet)."""
        if self.event_factory is not None or self.emit_row is None:
            return None
        return OpenStep(0, 0, 0.0, 0.0, 0, False), self.emit_row

    def close_cpu(self, s: OpenStep, t_end: float, phase_id: int, step: int, t_start: float,
                  data_wait_s: float, images: int, warmup: bool) -> None:
        """:meth:`end` for a CPU step whose identity and wait the loader kept in its own frame.

        The loader resets ``s`` (parts to 0, no loss) and makes it :attr:`current` itself, and
        closes it with these same lines written out in its loop (a call less a step; this
        method is the reference, and closes a step the loop broke out of): no ``open``/``end``
        calls and no attribute traffic for what the loader already holds.
        """
        self.current = None
        wall = t_end - t_start
        if wall < 0.0:
            wall = 0.0
        other = wall - data_wait_s - s.transfer_s - s.compute_s - s.comm_s
        assert self.emit_row is not None  # cpu_step() gave the step out only with a sink
        self.emit_row((phase_id, step, t_start + self._clock_offset, wall, data_wait_s,
                       s.transfer_s, s.compute_s, other if other > 0.0 else 0.0, images, warmup,
                       s.comm_s, s.loss))

    @property
    def clock_offset(self) -> float:
        """Unix time minus the step clock's time: what turns a step's start into Unix time."""
        return self._clock_offset

    def part(self, kind: str) -> _Part:
        """Time a region of the current step as ``transfer``, ``compute`` or ``comm``."""
        # A small reusable class rather than a @contextmanager generator: this runs twice per
        # step, and a generator-based context manager costs several microseconds each time.
        # A part already open (nested, or on another thread) gets a fresh timer of its own.
        cached = self._parts.get(kind)
        if cached is None or cached.active:
            cached = _Part(self, kind)
            self._parts[kind] = cached
        return cached

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
        wall = t_end - step.t_start
        if wall < 0.0:
            wall = 0.0
        if step.gpu_pairs is not None:
            rec = StepRecord(step.phase_id, step.step, step.t_start + self._clock_offset, wall,
                             step.data_wait_s, step.transfer_s, step.compute_s, 0.0,
                             step.images, step.warmup, step.comm_s, step.loss)
            self._pending.append((rec, step.gpu_pairs))
            self.resolve(block=False)
            return
        # The CPU-only path, inlined: it runs once per step of every instrumented loop.
        other = wall - step.data_wait_s - step.transfer_s - step.compute_s - step.comm_s
        row = (step.phase_id, step.step, step.t_start + self._clock_offset, wall,
               step.data_wait_s, step.transfer_s, step.compute_s, other if other > 0.0 else 0.0,
               step.images, step.warmup, step.comm_s, step.loss)
        self._spare = step
        if self.emit_row is not None:
            self.emit_row(row)
        else:
            self.emit(StepRecord(*row))

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


class _Part:
    """One timed region of the open step (see :meth:`StepTimer.part`).

    Entering and leaving one runs twice a step in every instrumented loop, beside the ``with``
    statement's own cost (~0.4 µs here: two special-method lookups, two calls): so the clock,
    whether GPU events are recorded and which figure the time goes to are fixed when the part is
    made, and the bodies touch little else (each attribute of the timer read per call cost
    ~0.1 µs on this machine).
    """

    __slots__ = ("_clock", "_gpu", "_kind", "_pair", "_step", "_t0", "_timer", "active")

    def __init__(self, timer: StepTimer, kind: str) -> None:
        self._timer = timer
        self._kind = kind
        self._clock = timer.clock
        self._gpu = timer.event_factory is not None
        self._step: OpenStep | None = None
        self._pair: tuple[GpuEvent, GpuEvent] | None = None
        self._t0 = 0.0
        self.active = False

    def __enter__(self) -> None:
        self.active = True
        # Outside a monitored loader there is no open step: nothing to attribute the time to.
        step = self._step = self._timer.current
        if step is not None:
            if self._gpu:
                self._pair = self._timer._record_start()
            self._t0 = self._clock()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        t = self._clock()
        self.active = False
        step = self._step
        if step is None:
            return
        self._step = None
        dt = t - self._t0
        kind = self._kind
        if self._gpu and self._pair is not None:
            start, end = self._pair
            self._pair = None
            end.record()
            if step.gpu_pairs is None:
                step.gpu_pairs = []
            step.gpu_pairs.append((kind, start, end))
        if kind == "compute":
            step.compute_s += dt
        elif kind == "transfer":
            step.transfer_s += dt
        else:
            setattr(step, f"{kind}_s", getattr(step, f"{kind}_s") + dt)


def _synchronize(event: GpuEvent) -> None:
    sync = getattr(event, "synchronize", None)
    if sync is not None:
        sync()
