"""The loop tracker on its own: steps, phases and epochs from iterator and body events, on a
fake clock; CUDA-event timing with fake events (no GPU here)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from stepscope.observe.inject import stepscope_watch_loop as loop_mod
from stepscope.observe.inject import stepscope_watch_recorder as recorder


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _Harness:
    def __init__(self, events: Any = None, hint: str | None = None) -> None:
        self.read_fd, write_fd = os.pipe()
        self.clock = _Clock()
        self.rec = recorder.Recorder(recorder.Channel(write_fd, clock=self.clock), clock=self.clock)
        self.loop = loop_mod.LoopTracker(self.rec, events=events or (lambda: None), hint=hint,
                                         mode_kind=lambda hint: "val")
        self.loaders = 0

    def iterator(self, loader: int | None = None) -> loop_mod.IterState:
        self.loaders += 1
        return loop_mod.IterState(self.loaders if loader is None else loader, self.clock.t, 0.0, 0)

    def fetch(self, it: loop_mod.IterState, wait: float, images: int = 8) -> None:
        self.loop.next_begin(it, self.clock.t)
        self.clock.t += wait
        self.loop.next_end(it, self.clock.t, images)

    def stop(self, it: loop_mod.IterState) -> None:
        self.loop.next_begin(it, self.clock.t)
        self.loop.next_stop(it, self.clock.t)

    def body(self, kind: str, dt: float) -> None:
        self.clock.t += dt
        self.loop.body(kind, self.clock.t)

    def messages(self) -> list[list[Any]]:
        self.loop.flush(self.clock.t)
        self.rec.channel.flush()
        os.close(self.rec.channel._fd)
        with os.fdopen(self.read_fd, "rb") as f:
            return [json.loads(line) for line in f]


def _phases(msgs: list[list[Any]]) -> list[tuple[int, str, int]]:
    ends = {m[1]: m[3] for m in msgs if m[0] == "E"}
    return [(m[2], m[3], ends.get(m[1], -1)) for m in msgs if m[0] == "P"]


def _steps(msgs: list[list[Any]]) -> list[list[Any]]:
    return [m for m in msgs if m[0] == "S"]


def _train_epoch(h: _Harness, it: loop_mod.IterState, n: int, wait: float = 0.01) -> None:
    for _ in range(n):
        h.fetch(it, wait)
        h.body("forward", 0.001)
        h.body("backward", 0.02)
        h.body("optimizer", 0.005)
        h.clock.t += 0.002
    h.stop(it)


def _val(h: _Harness, it: loop_mod.IterState, n: int) -> None:
    for _ in range(n):
        h.fetch(it, 0.01)
        h.body("forward", 0.01)
    h.stop(it)


def test_train_and_val_by_what_the_loop_does() -> None:
    h = _Harness()
    for _ in range(2):
        _train_epoch(h, h.iterator(), 3)
        _val(h, h.iterator(), 2)
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 3), (1, "val", 2), (2, "train", 3), (2, "val", 2)]
    first = _steps(msgs)[0]
    wall, wait, _transfer, compute, other = first[4:9]
    assert (wall, wait, compute, other) == pytest.approx((0.038, 0.01, 0.026, 0.002))


def test_zipped_iterators_share_one_step_and_one_epoch() -> None:
    h = _Harness()
    for _ in range(2):
        a, b = h.iterator(), h.iterator()
        for _ in range(3):
            h.fetch(a, 0.001)
            h.fetch(b, 0.1)  # the slow loader: its wait is the step's data wait
            h.body("backward", 0.01)
            h.body("optimizer", 0.001)
        h.fetch(a, 0.001)
        h.stop(b)  # zip ends on b: a's last batch was dropped
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 3), (2, "train", 3)]
    assert all(s[5] == pytest.approx(0.101) for s in _steps(msgs))


def test_unlabelled_iterator_recreated_mid_step_keeps_the_step() -> None:
    h = _Harness()
    a, u = h.iterator(), h.iterator(loader=99)
    h.fetch(a, 0.01)
    h.stop(u)  # except StopIteration: u = iter(unlabelled_loader)
    h.fetch(h.iterator(loader=99), 0.05)
    h.body("optimizer", 0.01)
    h.fetch(a, 0.01)
    h.body("optimizer", 0.01)
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 2)]
    assert _steps(msgs)[0][5] == pytest.approx(0.06)


def test_probe_joins_the_first_step() -> None:
    h = _Harness()
    probe = h.iterator()
    h.fetch(probe, 0.02)  # next(iter(loader)) before training
    h.clock.t += 1.0  # building the model
    _train_epoch(h, h.iterator(), 3)
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 3)]
    assert _steps(msgs)[0][10] is True  # a warm-up step


def test_backward_without_optimizer_step_is_training() -> None:
    h = _Harness()
    it = h.iterator()
    for i in range(4):
        h.fetch(it, 0.01)
        h.body("backward", 0.02)
        if i % 2:
            h.body("optimizer", 0.01)
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 4)]
    # compute ends at the backward when no optimizer step follows it
    assert _steps(msgs)[0][7] == pytest.approx(0.02)


def test_validation_inside_an_epoch_resumes_the_same_epoch() -> None:
    h = _Harness()
    train = h.iterator()
    for i in range(4):
        h.fetch(train, 0.01)
        h.body("optimizer", 0.01)
        if i == 1:  # val_check_interval=0.5 written by hand
            _val(h, h.iterator(), 2)
    msgs = h.messages()
    assert _phases(msgs) == [(1, "train", 4), (1, "val", 2)]


def test_forced_phase_and_mode_hint() -> None:
    h = _Harness()
    it = h.iterator()
    h.loop.forced = "val"
    h.fetch(it, 0.01)
    h.body("optimizer", 0.01)
    h.loop.forced = None
    h.fetch(it, 0.01)
    h.body("optimizer", 0.01)
    assert [p[1] for p in _phases(h.messages())] == ["val", "train"]
    moded = _Harness(hint="mode")  # mode_kind says "val" in this harness
    it = moded.iterator()
    moded.fetch(it, 0.01)
    moded.body("optimizer", 0.01)
    assert [p[1] for p in _phases(moded.messages())] == ["val"]


class _Event:
    """A fake CUDA event: ``gpu_t`` is when the GPU's stream reached it."""

    def __init__(self, gpu_t: float, done: bool = True) -> None:
        self.gpu_t, self.done = gpu_t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: _Event) -> float:
        return (end.gpu_t - self.gpu_t) * 1000.0

    def synchronize(self) -> None:
        self.done = True


def test_cuda_events_give_the_gpu_idle_wait() -> None:
    # The CPU waits 60 ms for each batch, but the GPU still runs the previous step's queued
    # work for 50 ms of it: the GPU idled 10 ms, and that is the step's data wait.
    gpu_times = iter([0.050, 0.060, 0.150, 0.200])  # request, batch, optimizer end, next request
    h = _Harness(events=lambda: _Event(next(gpu_times)))
    it = h.iterator()
    h.fetch(it, 0.06)
    h.body("optimizer", 0.01)
    h.clock.t += 0.03
    h.loop.next_begin(it, h.clock.t)  # ends the step: its events resolve lazily
    step = _steps(h.messages())[0]
    wall, wait, _transfer, compute, other = step[4:9]
    assert wall == pytest.approx(0.1)
    assert wait == pytest.approx(0.01)
    assert compute == pytest.approx(0.09)
    assert other == pytest.approx(0.0)


def test_unfinished_events_are_not_waited_for() -> None:
    events = [_Event(0.0, done=False) for _ in range(4)]
    pending = iter(events)
    h = _Harness(events=lambda: next(pending))
    it = h.iterator()
    h.fetch(it, 0.01)
    h.body("optimizer", 0.01)
    h.loop.next_begin(it, h.clock.t)
    assert len(h.loop.pending) == 1 and not any(e.done for e in events)


def test_phase_hint_api_sets_the_active_tracker(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import stepscope
    from stepscope.errors import StepscopeError

    h = _Harness()
    monkeypatch.setitem(sys.modules, "stepscope_watch_loop", loop_mod)
    monkeypatch.setattr(loop_mod, "ACTIVE", h.loop)
    with stepscope.phase_hint("val"):
        assert h.loop.forced == "val"
    assert h.loop.forced is None
    with pytest.raises(StepscopeError, match="unknown phase"), stepscope.phase_hint("test"):
        pass
    h.messages()


def test_cuda_context_measured_around_lazy_init() -> None:
    from types import SimpleNamespace

    from stepscope.observe.inject import stepscope_watch_torch as hooks

    h = _Harness()
    me = os.getpid()
    listed: list[SimpleNamespace] = []
    nv = SimpleNamespace(
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetComputeRunningProcesses=lambda h: list(listed))
    state = {"init": False}

    def lazy_init() -> None:  # creating the context: NVML lists the process with 480 MB
        state["init"] = True
        listed.append(SimpleNamespace(pid=me, usedGpuMemory=480 << 20))

    cuda = SimpleNamespace(_lazy_init=lazy_init, is_initialized=lambda: state["init"])
    hooks._hook_cuda_init(SimpleNamespace(cuda=cuda), h.rec, nvml=nv)
    cuda._lazy_init()
    cuda._lazy_init()  # already initialised: measured once
    facts = [m for m in h.messages() if m[0] == "F" and m[1] == "mem.cuda_context_bytes"]
    assert [f[2] for f in facts] == [480 << 20]


def test_a_step_that_compiled_is_warm_up() -> None:
    # torch.compile compiles in the first steps and again for a ragged last batch: a step
    # during which the compile counter moved is warm-up, wherever it falls in the phase.
    h = _Harness()
    graphs = [0]
    h.loop.compiles = lambda: graphs[0]
    it = h.iterator()
    for i in range(8):
        h.fetch(it, 0.01)
        if i in (0, 6):
            graphs[0] += 1  # dynamo compiled during this step's forward
        h.body("forward", 0.001)
        h.body("backward", 0.02)
        h.body("optimizer", 0.005)
    h.stop(it)
    warm = [m[10] for m in _steps(h.messages())]
    assert warm == [True, True, True, False, False, False, True, False]


def test_dynamo_compiles_reads_the_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from types import SimpleNamespace

    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert loop_mod.dynamo_compiles() == 0  # dynamo never loaded: nothing compiled
    fake = SimpleNamespace(counters={"stats": {"unique_graphs": 3}})
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake)
    assert loop_mod.dynamo_compiles() == 3
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", SimpleNamespace())
    assert loop_mod.dynamo_compiles() == 0  # another torch's layout: no claim


def test_framework_copy_before_batch_start_is_transfer() -> None:
    # Lightning: fetch (30 ms), transfer_batch_to_device (40 ms), a hook (1 ms), then the
    # batch-start callback; the step's wait ends where the copy began.
    h = _Harness()
    h.rec.cb_phase_begin("val", lambda first, last: 0)
    for _ in range(2):
        h.clock.t += 0.030
        t0 = h.clock.t
        h.clock.t += 0.040
        h.rec.cb_transfer(t0, 0.040)
        h.clock.t += 0.001
        h.rec.cb_batch_begin(0)
        h.clock.t += 0.010
        h.rec.cb_batch_end(0, 8)
    h.rec.cb_phase_end()
    steps = [m for m in h.messages() if m[0] == "S"]
    assert len(steps) == 2
    for s in steps:
        wall, wait, transfer, compute, other = s[4:9]
        assert (wait, transfer) == (pytest.approx(0.030), pytest.approx(0.040))
        assert compute == pytest.approx(0.011) and other == pytest.approx(0.0, abs=1e-9)
        assert wall == pytest.approx(wait + transfer + compute + other)


def test_framework_copy_outside_a_phase_is_ignored() -> None:
    h = _Harness()
    h.rec.cb_transfer(h.clock.t, 0.040)  # sanity-check validation: no phase is open
    h.rec.cb_phase_begin("val", lambda first, last: 0)
    h.clock.t += 0.030
    h.rec.cb_batch_begin(0)
    h.clock.t += 0.010
    h.rec.cb_batch_end(0, 8)
    h.rec.cb_phase_end()
    (s,) = [m for m in h.messages() if m[0] == "S"]
    assert (s[5], s[6]) == (pytest.approx(0.030), 0.0)
