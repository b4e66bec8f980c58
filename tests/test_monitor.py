"""The public Monitor API on real loops (sampling off here; samplers have their own tests)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope import Monitor
from stepscope.observe.monitor import CLOCK_EVERY, CLOCK_MIN_S
from stepscope.store.db import RunReader


def _loader(n: int = 40, batch: int = 8) -> DataLoader:
    ds = TensorDataset(torch.randn(n, 3, 8, 8), torch.randint(0, 2, (n,)))
    return DataLoader(ds, batch_size=batch)


def test_records_phases_steps_and_split(tmp_path: Path) -> None:
    model = torch.nn.Linear(3 * 8 * 8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(tmp_path, sample=False, warmup_steps=1) as mon:
        for epoch in range(2):
            for x, y in mon.loader(_loader(), phase="train", epoch=epoch):
                with mon.copy():
                    x = x.flatten(1)
                with mon.compute():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                time.sleep(0.002)
            with torch.no_grad():
                for x, _ in mon.loader(_loader(16), phase="val", epoch=epoch):
                    with mon.compute():
                        model(x.flatten(1))
    r = RunReader(tmp_path)
    assert r.run().status == "completed"
    phases = r.phases()
    assert [(p.epoch, p.phase, p.steps, p.images) for p in phases] == [
        (0, "train", 5, 40), (0, "val", 2, 16), (1, "train", 5, 40), (1, "val", 2, 16)]
    steps = r.steps()
    assert len(steps) == 14
    for s in steps:
        parts = s.data_wait_s + s.transfer_s + s.compute_s + s.other_s
        assert abs(parts - s.wall_s) <= 0.05 * s.wall_s + 1e-9
    for s in r.steps(phases[0].phase_id):
        assert s.other_s >= 0.0019  # the sleep after the compute block lands in "other"
    # Warm-up: only the first step of the first train and the first val phase.
    assert [(s.phase_id, s.step) for s in steps if s.warmup] == [(0, 0), (1, 0)]


def test_exception_marks_run_failed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Monitor(tmp_path, sample=False) as mon:
        for _ in mon.loader(_loader(), phase="train", epoch=0):
            raise RuntimeError("boom")
    r = RunReader(tmp_path)
    assert r.run().status == "failed"
    assert r.phases()[0].steps == 1 and len(r.steps()) == 1


def test_break_out_of_loader_closes_phase(tmp_path: Path) -> None:
    with Monitor(tmp_path, sample=False) as mon:
        for i, _ in enumerate(mon.loader(_loader(), phase="train", epoch=0)):
            with mon.compute():
                time.sleep(0.002)
            mon.set_loss(0.5 + i)
            if i == 1:
                break  # the step broken out of is closed by the loader's cleanup
    r = RunReader(tmp_path)
    assert r.phases()[0].steps == 2
    steps = r.steps()
    assert [(s.step, s.loss, s.images) for s in steps] == [(0, 0.5, 8), (1, 1.5, 8)]
    assert all(s.compute_s >= 0.0019 and s.wall_s >= s.compute_s for s in steps)


def test_bad_phase_name(tmp_path: Path) -> None:
    with Monitor(tmp_path, sample=False) as mon, pytest.raises(ValueError, match="phase"):
        list(mon.loader([1, 2], phase="test", epoch=0))


def test_live_stats(tmp_path: Path) -> None:
    with Monitor(tmp_path, sample=False) as mon:
        for _ in mon.loader(_loader(), phase="train", epoch=0):
            time.sleep(0.001)
        live = mon.live()
    assert live.images_per_s and live.images_per_s > 0
    assert live.data_wait_frac is not None and 0 <= live.data_wait_frac <= 1


def _spin_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _inline_wait_fact(tmp_path: Path, items: list[float], load: str) -> dict:
    def batches():  # inline loading (workers=0): the loop's own thread loads each item
        for s in items:
            if load == "cpu":
                _spin_cpu(s)
            elif load == "sleep":
                time.sleep(s)
            yield s

    with Monitor(tmp_path, sample=False) as mon:
        for _ in mon.loader(batches(), phase="train", epoch=1, workers=0):
            pass
    return RunReader(tmp_path).facts()["stages.phase.0"].value


def test_inline_wait_cpu_is_the_loading_threads_cpu(tmp_path: Path) -> None:
    # Planted in CPU time (spin on the thread's own clock) and in sleeps: exact at any load.
    cpu = _inline_wait_fact(tmp_path / "cpu", [0.004] * 30, "cpu")
    assert cpu["waits"] == 30 and cpu["wait_cpu_clocked_s"] >= 0.9 * cpu["wait_s"]
    assert cpu["wait_cpu_s"] >= 0.9 * 30 * 0.004
    slept = _inline_wait_fact(tmp_path / "sleep", [0.004] * 30, "sleep")
    assert slept["wait_cpu_s"] <= 0.3 * slept["wait_s"]


def test_microsecond_waits_are_clocked_one_in_many(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches that come in microseconds: the thread's CPU clock (a system call) is read around
    # a wait after a long one and around one wait in CLOCK_EVERY; the short ones left unread
    # count as CPU. Every step is still recorded.
    reads = []
    real = time.thread_time
    monkeypatch.setattr(time, "thread_time", lambda: reads.append(1) or real())
    fact = _inline_wait_fact(tmp_path, [0.0] * 5000, "none")
    monkeypatch.undo()
    steps = RunReader(tmp_path).steps()
    assert fact["waits"] == len(steps) == 5000
    long_waits = sum(s.data_wait_s >= CLOCK_MIN_S for s in steps)  # preempted, under load
    assert len(reads) <= 2 * (5000 // CLOCK_EVERY + long_waits + 2)
    short_s = sum(s.data_wait_s for s in steps if s.data_wait_s < CLOCK_MIN_S)
    assert 0.5 * short_s <= fact["wait_cpu_s"] <= fact["wait_s"]


def test_images_counted_from_the_first_tensor_like_element() -> None:
    # Exact tuples, lists and numbers take a fast path; subclasses and other types the general
    # one, twice each (the second time from the per-type cache): the counts must not differ.
    import collections

    import numpy as np

    from stepscope.observe.monitor import _count_images

    pair = collections.namedtuple("pair", "x y")

    class Batch(list):  # a list subclass holding tensors
        pass

    cases = [((5, 1), 1), ([1.0, 2.0], 1), ((True, 1), 1), (pair(3, 4), 1),
             ((np.zeros((4, 2)), 1), 4), ([[7, 8]], 1), ({"a": np.zeros(3)}, 3),
             ((np.float64(1.0),), 1), ((np.int64(2),), 1), ((np.array(5.0),), 1),
             (({"x": torch.zeros(6, 2)},), 6), ((torch.zeros(5, 3), torch.zeros(5)), 5),
             (pair(torch.zeros(7), 0), 7), (Batch([torch.zeros(2, 1)]), 2), ("abc", 3),
             (None, 1), ((), 0), ([], 0)]
    for _ in range(2):
        assert [_count_images(batch) for batch, _n in cases] == [n for _b, n in cases]
