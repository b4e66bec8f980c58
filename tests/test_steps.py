"""The step timer: exact splits with a fake clock; lazy GPU event resolution with fake events."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stepscope.observe.steps import StepTimer
from stepscope.store.records import StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def test_parts_add_up_exactly() -> None:
    clock, out = FakeClock(), []
    timer = StepTimer(emit=out.append, clock=clock, wall_clock=lambda: 1000.0)
    timer.begin(phase_id=0, step=0, t_start=0.0, data_wait_s=0.25, images=8, warmup=True)
    clock.now = 0.25
    with timer.part("transfer"):
        clock.advance(0.05)
    with timer.part("compute"):
        clock.advance(0.5)
    clock.advance(0.2)  # logging, metrics: "other"
    timer.end(clock.now)
    (rec,) = out
    assert rec.wall_s == 1.0
    assert (rec.data_wait_s, rec.transfer_s, rec.compute_s) == pytest.approx((0.25, 0.05, 0.5))
    assert rec.other_s == pytest.approx(0.2)
    assert rec.data_wait_s + rec.transfer_s + rec.compute_s + rec.other_s == pytest.approx(rec.wall_s)
    assert rec.warmup and rec.images == 8
    assert rec.t_start == 1000.0  # monotonic clock mapped onto Unix time


def test_part_outside_a_step_is_ignored() -> None:
    out: list[StepRecord] = []
    timer = StepTimer(emit=out.append)
    with timer.part("compute"):
        pass
    timer.end(1.0)
    assert out == []


@dataclass
class FakeEvent:
    """Stands in for torch.cuda.Event (no GPU here); its time is set by the test."""

    t_ms: float = 0.0
    done: bool = False
    recorded: bool = False

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.t_ms - self.t_ms

    def synchronize(self) -> None:
        self.done = True


def test_gpu_parts_resolve_lazily_without_blocking() -> None:
    clock, out, events = FakeClock(), [], []

    def factory() -> FakeEvent:
        events.append(FakeEvent())
        return events[-1]

    timer = StepTimer(emit=out.append, clock=clock, event_factory=factory)
    timer.begin(phase_id=0, step=0, t_start=0.0, data_wait_s=0.1, images=8, warmup=False)
    with timer.part("transfer"):
        clock.advance(0.001)  # the CPU only launches the copy
    with timer.part("compute"):
        clock.advance(0.01)
    clock.now = 1.0
    timer.end(1.0)
    assert out == []  # the GPU has not passed the events yet: nothing emitted, nothing waited
    start_t, end_t, start_c, end_c = events
    start_t.t_ms, end_t.t_ms, start_c.t_ms, end_c.t_ms = 0.0, 100.0, 100.0, 800.0
    end_t.done = end_c.done = True
    timer.resolve(block=False)
    (rec,) = out
    assert abs(rec.transfer_s - 0.1) < 1e-9 and abs(rec.compute_s - 0.7) < 1e-9
    assert abs(rec.data_wait_s + rec.transfer_s + rec.compute_s + rec.other_s - rec.wall_s) < 1e-9


def test_gpu_time_never_exceeds_the_wall_frame() -> None:
    clock, out, events = FakeClock(), [], []

    def factory() -> FakeEvent:
        events.append(FakeEvent(done=True))
        return events[-1]

    timer = StepTimer(emit=out.append, clock=clock, event_factory=factory)
    timer.begin(phase_id=0, step=0, t_start=0.0, data_wait_s=0.2, images=8, warmup=False)
    with timer.part("compute"):
        pass
    events[1].t_ms = 5000.0  # the GPU was 5 s behind: queued work from earlier steps
    timer.end(1.0)
    timer.resolve(block=True)
    (rec,) = out
    assert abs(rec.compute_s - 0.8) < 1e-9 and rec.other_s == 0.0
