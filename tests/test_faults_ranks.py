"""A rank whose batch is unreadable keeps step with the others (gloo, two real processes): the
job goes on within seconds, not at a collective's timeout, and the weights stay equal. Timed:
each rank's bound is seconds against a 30 s collective timeout, so these run in the timed lane."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


def _null_step_worker(rank: int, init_file: str, out_dir: str) -> None:
    import datetime as dt

    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.train.loop import _null_step

    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                             timeout=dt.timedelta(seconds=30))
    torch.manual_seed(0)
    net = DistributedDataParallel(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.ones(3, 4)
    t0 = time.monotonic()
    for _ in range(3):
        if rank == 1:  # every image of this rank's batch was unreadable
            _null_step(net, opt, x[:1], torch.device("cpu"))
        else:
            opt.zero_grad()
            net(x).sum().backward()
            opt.step()
    took = time.monotonic() - t0
    weights = [p.detach().clone() for p in net.parameters()]
    torch.save({"took": took, "weights": weights}, f"{out_dir}/rank{rank}.pt")
    tdist.destroy_process_group()


def test_a_rank_with_an_unreadable_batch_keeps_step_with_the_others(tmp_path: Path) -> None:
    """gloo, 2 processes: rank 1's batches are all unreadable, rank 0's are fine. The job goes
    on together within seconds (no 600 s collective timeout) and the weights stay equal."""
    import torch
    import torch.multiprocessing as mp

    t0 = time.monotonic()
    mp.start_processes(_null_step_worker, args=(str(tmp_path / "init"), str(tmp_path)),
                       nprocs=2, start_method="spawn")
    assert time.monotonic() - t0 < 120  # spawning and imports included; no collective timeout
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["took"] < 20 and r1["took"] < 20
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b)


def _first_batch_worker(rank: int, init_file: str, out_dir: str) -> None:
    """One rank of a 2-rank job through the trainer's own phase loop; rank 1's FIRST batch has
    no readable image, so it has no earlier batch to copy an input shape from."""
    import contextlib
    import datetime as dt
    from typing import Any

    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    from stepscope.observe.monitor import Monitor
    from stepscope.train.data import Batch
    from stepscope.train.loop import run_phase
    from stepscope.train.setup import Setup

    class Tiny(torch.nn.Module):
        num_classes = 3

        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(3 * 8 * 8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.float().flatten(1) / 255.0)

        def loss_fn(self) -> torch.nn.Module:
            return torch.nn.CrossEntropyLoss()

    class Quiet:
        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: contextlib.nullcontext()

    # A regression hangs in the all-reduce: 30 s, not torch's 600 s, then this rank fails.
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                             timeout=dt.timedelta(seconds=30))
    torch.manual_seed(0)
    model = Tiny()
    net = DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    good = [Batch(torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8, generator=gen),
                  torch.randint(0, 3, (4,), generator=gen), []) for _ in range(3)]
    unreadable = Batch(torch.empty((0, 3, 0, 0), dtype=torch.uint8),
                       torch.empty((0,), dtype=torch.int64), [f"bad{i}.jpg" for i in range(4)])
    batches = [unreadable, *good[:2]] if rank == 1 else good
    s = Setup(torch.device("cpu"), Any, None, None, model, 0, False, 1, False,  # type: ignore[arg-type]
              ddp=net, image_shape=(3, 8, 8))
    mon = Monitor(Path(out_dir) / f"run{rank}", sample=False, stage_timing=False)
    t0 = time.monotonic()
    res = run_phase(mon, s, batches, phase="train", epoch=0, epochs=1, optimizer=opt,
                    progress=Quiet(), probe=Quiet())  # type: ignore[arg-type]
    took = time.monotonic() - t0
    torch.save({"took": took, "bad": res.bad_files,
                "weights": [p.detach().clone() for p in net.parameters()]},
               f"{out_dir}/rank{rank}.pt")
    tdist.destroy_process_group()


@pytest.mark.slow  # ~1 s of training; importing the trainer (timm) costs the rest
def test_a_rank_whose_first_batch_is_unreadable_keeps_step_with_the_others(
        tmp_path: Path) -> None:
    """gloo, 2 processes, the trainer's phase loop: rank 1's first batch is all unreadable (no
    earlier batch gives it an input shape). It joins the step with a blank image of the
    configured shape: the job goes on together within seconds and the weights stay equal."""
    import torch
    import torch.multiprocessing as mp

    import stepscope.train.loop  # noqa: F401  (imported once here, inherited by the children)

    # fork: the children inherit this interpreter's imports (spawn would re-import torch).
    mp.start_processes(_first_batch_worker, args=(str(tmp_path / "init"), str(tmp_path)),
                       nprocs=2, start_method="fork")
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["took"] < 15 and r1["took"] < 15
    assert r1["bad"] == [f"bad{i}.jpg" for i in range(4)] and r0["bad"] == []
    for a, b in zip(r0["weights"], r1["weights"], strict=True):
        assert torch.equal(a, b)


def test_a_rank_that_cannot_join_the_step_stops_with_one_line() -> None:
    """No batch seen and no configured input shape: the rank stops (its launcher then stops the
    others at once) with a clear line, rather than leaving them in the all-reduce."""
    import torch

    from stepscope.errors import StepscopeError
    from stepscope.train.loop import _null_input
    from stepscope.train.setup import Setup

    s = Setup(torch.device("cpu"), None, None, None, None, 0, False, 1, False)  # type: ignore[arg-type]
    with pytest.raises(StepscopeError, match="first batch was unreadable"):
        _null_input(None, s)
    s.image_shape = (3, 8, 8)
    assert _null_input(None, s).shape == (1, 3, 8, 8)
    hint = torch.zeros(1, 3, 5, 5)
    assert _null_input(hint, s) is hint
