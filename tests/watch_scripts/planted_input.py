"""A plain PyTorch loop with one planted input-pipeline cost, for the known-answer scenarios.

Usage: ``python planted_input.py SCENARIO MODE OUT`` where MODE is ``plain`` (run as any
script, e.g. under ``stepscope watch``) or ``monitor`` (the ``stepscope.Monitor`` API records
into OUT). Costs are planted so they stay right on a loaded machine: latency is a sleep, CPU
work is a busy loop that runs until this thread has *used* that much CPU (so other processes
sharing the cores stretch it in time but never change how much work it is).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image  # at the top, as a dataset module would: spawned workers import it early
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

torch.set_num_threads(1)  # one compute thread: the scenarios count cores


def burn(ms: float) -> None:
    """Use ``ms`` of this thread's CPU time."""
    end = time.thread_time() + ms / 1000.0
    x = 0
    while time.thread_time() < end:
        x += 1


SCENARIOS: dict[str, dict[str, Any]] = {
    # Two workers on a two-core job, each item 24 ms of CPU, the model 25 ms of CPU a batch: the
    # loaders alone fill the cores. (At 12 ms an item two loaders supplied 114 img/s against a
    # 125 img/s limit of the cores, so a third worker was worth 1.10x: the edge of the rule, and
    # one CI rehearsal in four said `workers`.)
    "cpu_saturated": {"workers": 2, "item_burn_ms": 24, "compute_burn_ms": 25},
    # The same, the 24 ms spent decoding (PIL), in workers started with `spawn` (fresh
    # interpreters: the stage hooks must be installed there too); validation inline.
    # 25 batches: the workers' start-up (each imports torch again) is paid once already.
    # (At 12 ms a faster host read 20 % wait, on the input-bound threshold: compute-bound once.)
    "cpu_saturated_spawn": {"workers": 2, "item_decode_burn_ms": 24, "compute_burn_ms": 25,
                            "context": "spawn", "val_workers": 0, "batches": 25},
    # One worker, 8 ms of latency an item (a remote read), almost no CPU anywhere.
    "workers_latency": {"workers": 1, "item_sleep_ms": 8, "compute_sleep_ms": 8},
    "workers_latency_fixed": {"workers": 4, "item_sleep_ms": 8, "compute_sleep_ms": 8},
    # Loading inline: 5 ms of CPU an item, the model 10 ms of CPU a batch, a core to spare.
    "inline_spare_core": {"workers": 0, "item_burn_ms": 5, "compute_burn_ms": 10},
    # A collate_fn that takes 40 ms, in the training process (workers=0).
    "main_collate": {"workers": 0, "collate_sleep_ms": 40, "compute_sleep_ms": 10},
    # The model 80 ms a batch, loading nothing: well clear of the scheduling latency of a
    # loaded host (receiving a batch from a worker needs that worker to be scheduled).
    "compute_bound": {"workers": 2, "compute_sleep_ms": 80, "batches": 25},
    # A big host-side conversion and copy every step (uint8 → float, 8×3×384×384).
    "transfer_bound": {"workers": 0, "big": True, "copy_sleep_ms": 40, "compute_sleep_ms": 5,
                       "batches": 30},
    # One 3 s stall in a compute-bound phase of 60 steps.
    "slow_step": {"workers": 0, "compute_sleep_ms": 25, "slow_item": 8 * 30, "slow_s": 3.0,
                  "batches": 60},
    "few_steps": {"workers": 0, "item_sleep_ms": 8, "compute_sleep_ms": 5, "batches": 10},
    # Validation run inside the training epoch, at its 20th step.
    # Loading inline (nothing to receive from a worker): the train phase is the model's.
    "val_inside_train": {"workers": 0, "compute_sleep_ms": 60, "val_at": 12, "batches": 25},
    # Two loaders zipped, the second slow (one worker, 8 ms an item).
    "two_loaders": {"workers": 1, "item_sleep_ms": 8, "compute_sleep_ms": 8, "two": True},
    # Worker start-up (1.5 s each time workers start) against ~1.5 s of steps per epoch.
    "nonpersistent": {"workers": 2, "init_sleep_s": 1.5, "compute_sleep_ms": 30, "epochs": 3},
    "persistent": {"workers": 2, "init_sleep_s": 1.5, "compute_sleep_ms": 30, "epochs": 3,
                   "persistent": True},
    "iterable": {"workers": 1, "item_sleep_ms": 8, "compute_sleep_ms": 8, "iterable": True},
    # Files read from PLANTED_DIR (evicted and throttled by the test): epoch 1 from the disk,
    # epoch 2 from the page cache.
    "storage": {"workers": 1, "files": True, "compute_sleep_ms": 5, "epochs": 2, "batches": 10},
    # Run under `taskset -c 0`: two workers burning CPU on the one core the job may use.
    "one_core": {"workers": 2, "item_burn_ms": 6, "compute_burn_ms": 10},
}
BATCH = 8
# A 16×16 PNG: items that "decode" open it from a buffer whose first read costs the planted CPU.
_PNG = io.BytesIO()
Image.new("RGB", (16, 16), (90, 120, 200)).save(_PNG, format="PNG")


class CostlyBuffer(io.BytesIO):
    """An encoded image whose decoding costs ``ms`` of CPU, paid on the first read once armed
    (``ms`` set after ``Image.open`` has read the header: PIL decodes the pixels later, in
    ``ImageFile.load``, which ``convert`` calls)."""

    def __init__(self, data: bytes, ms: float) -> None:
        super().__init__(data)
        self.ms = ms

    def read(self, n: int | None = -1) -> bytes:
        if self.ms:
            burn(self.ms)
            self.ms = 0.0
        return super().read(n)


class Planted(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int, cfg: dict[str, Any]) -> None:
        self.n, self.cfg = n, cfg

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return item(i, self.cfg)


class PlantedStream(IterableDataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int, cfg: dict[str, Any]) -> None:
        self.n, self.cfg = n, cfg

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = torch.utils.data.get_worker_info()
        k, m = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(k, self.n, m):
            yield item(i, self.cfg)


def item(i: int, cfg: dict[str, Any]) -> tuple[torch.Tensor, int]:
    if cfg.get("files"):
        folder = Path(os.environ["PLANTED_DIR"])
        with open(folder / f"{i}.bin", "rb") as f:
            f.read()
    if cfg.get("item_sleep_ms"):
        time.sleep(cfg["item_sleep_ms"] / 1000.0)
    if cfg.get("item_burn_ms"):
        burn(cfg["item_burn_ms"])
    if cfg.get("item_decode_burn_ms"):
        buf = CostlyBuffer(_PNG.getvalue(), 0.0)
        img = Image.open(buf)  # the header only, as torchvision's pil_loader
        buf.ms = cfg["item_decode_burn_ms"]
        img.convert("RGB")
    if cfg.get("slow_item") == i:
        time.sleep(cfg["slow_s"])
    if cfg.get("big"):
        return torch.zeros(3, 384, 384, dtype=torch.uint8), i % 2
    return torch.zeros(3, 16, 16), i % 2


# Classes, not closures: a worker started with ``spawn`` receives them pickled.
class Collate:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def __call__(self, samples: list[Any]) -> Any:
        if self.cfg.get("collate_sleep_ms"):
            time.sleep(self.cfg["collate_sleep_ms"] / 1000.0)
        return torch.utils.data.default_collate(samples)


class WorkerInit:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def __call__(self, _: int) -> None:
        # start-up: imports, dataset set-up, spawn
        time.sleep(self.cfg.get("init_sleep_s", 0.0))


def loader(cfg: dict[str, Any], n: int, sleep_ms: bool = True) -> DataLoader[Any]:
    c = cfg if sleep_ms else {k: v for k, v in cfg.items() if not k.startswith("item_")}
    ds: Any = PlantedStream(n, c) if cfg.get("iterable") else Planted(n, c)
    w = cfg["workers"]
    return DataLoader(ds, batch_size=BATCH, num_workers=w, collate_fn=Collate(cfg),
                      worker_init_fn=WorkerInit(cfg) if w else None,
                      persistent_workers=bool(cfg.get("persistent")) and w > 0,
                      multiprocessing_context=cfg.get("context") if w else None)


def main(name: str, mode: str, out: str, *overrides: str) -> None:
    cfg = dict(SCENARIOS[name])
    for kv in overrides:  # e.g. workers=3 or persistent=1: the fix a finding proposed
        key, value = kv.split("=", 1)
        cfg[key] = int(value) if value.isdigit() else value  # context=spawn
    batches = cfg.get("batches", 40)
    model = nn.Linear(3 * 384 * 384 if cfg.get("big") else 3 * 16 * 16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = loader(cfg, batches * BATCH, sleep_ms=not cfg.get("two"))
    val = loader({**cfg, "workers": cfg.get("val_workers", cfg["workers"])}, 8 * BATCH,
                 sleep_ms=False)
    slow = loader({**cfg, "workers": 1}, batches * BATCH) if cfg.get("two") else None
    if mode == "monitor":
        import stepscope

        with stepscope.Monitor(out, interval_s=0.25) as mon:
            run(cfg, model, opt, train, val, slow, mon)
    else:
        run(cfg, model, opt, train, val, slow, None)


def run(cfg: dict[str, Any], model: nn.Module, opt: Any, train: Any, val: Any, slow: Any,
        mon: Any) -> None:
    def wrap(it: Iterable[Any], phase: str, epoch: int) -> Iterable[Any]:
        return it if mon is None else mon.loader(it, phase=phase, epoch=epoch)

    def part(kind: str) -> Any:
        return contextlib.nullcontext() if mon is None else getattr(mon, kind)()

    for epoch in range(1, cfg.get("epochs", 1) + 1):
        model.train()
        source: Any = zip(train, slow, strict=False) if slow is not None else train
        for i, batch in enumerate(wrap(source, "train", epoch)):
            x, y = batch[1] if slow is not None else batch
            with part("copy"):
                if cfg.get("big"):
                    x = x.float().div_(255.0)  # the host-side conversion of a uint8 batch
                    time.sleep(cfg["copy_sleep_ms"] / 1000.0)
                x = x.flatten(1)
            with part("compute"):
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if cfg.get("compute_burn_ms"):
                    burn(cfg["compute_burn_ms"])
                if cfg.get("compute_sleep_ms"):
                    time.sleep(cfg["compute_sleep_ms"] / 1000.0)
                opt.step()
                opt.zero_grad()
            if cfg.get("val_at") == i + 1:
                validate(model, val, wrap, epoch, part)
                model.train()
        if not cfg.get("val_at"):
            validate(model, val, wrap, epoch, part)


def validate(model: nn.Module, val: Any, wrap: Any, epoch: int, part: Any) -> None:
    model.eval()
    with torch.no_grad():
        for x, _ in wrap(val, "val", epoch):
            with part("compute"):
                model(x.float().flatten(1))
                time.sleep(0.02)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *sys.argv[4:])
