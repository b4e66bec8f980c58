"""The public Monitor API on real loops (sampling off here; samplers have their own tests)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from stepscope import Monitor
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
            if i == 1:
                break
    assert RunReader(tmp_path).phases()[0].steps == 2


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
