"""What does :class:`stepscope.Monitor` cost a training loop? Throughput instrumented / bare.

One plain PyTorch loop (JPEGs decoded and resized by one DataLoader worker, a small timm CNN,
Adam, batch 8, CPU, a validation pass per epoch) runs bare and instrumented: the same loop with
``Monitor.loader`` around both loaders, ``Monitor.copy`` and ``Monitor.compute`` around the step's
parts, and the samplers on at 1 Hz (process tree with the worker, host, disk, page-cache
residency of the dataset), everything written to SQLite. Bare and instrumented runs alternate,
each in a fresh process, so drifting machine load hits both alike.

Each run times itself: images per second from the end of the first epoch's warm-up steps to the
end of the last epoch (worker start-up in later epochs counts for both), so imports, model
building and the Monitor's start and final flush are not counted: what is measured is what the
instrumentation adds while training runs. It also reports the training process's CPU seconds
per image (all its threads, the sampler's included), less disturbed by other load than
throughput is, and the CPU time of the Monitor's own sampler and writer threads as a share of one
core (the ``monitor.cpu_s`` fact): the direct cost, which other load hardly moves.

Usage:
    .venv/bin/python bench/overhead.py [--pairs 5] [--epochs 4] [--images 160]

The last line is the headline figure as one JSON object (median of the per-pair ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import timm
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMG_SIZE = 112
BATCH_SIZE = 8
WARMUP_STEPS = 5
MODEL = "mobilenetv2_050"


class JpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """Decode, resize to ``IMG_SIZE``, random horizontal flip: uint8 CHW tensors."""

    def __init__(self, items: list[tuple[Path, int]], train: bool) -> None:
        self.items, self.train = items, train

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if img is None:
            raise RuntimeError(f"cannot decode {path}")
        img = cv2.resize(img, (IMG_SIZE, IMG_SIZE), interpolation=cv2.INTER_AREA)
        if self.train and np.random.rand() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), label


def _items(csv_path: Path, images: Path) -> list[tuple[Path, int]]:
    rows = [line.split(",") for line in csv_path.read_text().splitlines()[1:] if line]
    return [(images / name, int(cls.strip() == "dog")) for name, cls in rows]


class _Bare:
    """Stands in for the Monitor in the bare run: the same call sites, doing nothing."""

    def loader(self, it: Iterable[Any], *, phase: str, epoch: int) -> Iterator[Any]:
        return iter(it)

    def copy(self) -> Any:
        return _NULL

    def compute(self) -> Any:
        return _NULL


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


def _loop(mon: Any, model: nn.Module, train: DataLoader[Any], val: DataLoader[Any],
          epochs: int) -> dict[str, float]:
    """The training loop, timed from the end of warm-up to the end of the last epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    t0 = c0 = 0.0
    images = 0
    for epoch in range(1, epochs + 1):
        model.train()
        for i, (x, y) in enumerate(mon.loader(train, phase="train", epoch=epoch)):
            if epoch == 1 and i == WARMUP_STEPS:
                t0, c0, images = time.perf_counter(), time.process_time(), 0
            with mon.copy():
                x, y = x.to("cpu", non_blocking=True), y.to("cpu", non_blocking=True)
            with mon.compute():
                loss = loss_fn(model((x.float() - mean) / 64.0), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            images += len(y)
        model.eval()
        with torch.no_grad():
            for x, _ in mon.loader(val, phase="val", epoch=epoch):
                with mon.compute():
                    model((x.float() - mean) / 64.0)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"images_per_s": images / wall_s, "cpu_s_per_image": cpu_s / images,
            "wall_s": wall_s}


def run_child(kind: str, data: Path, out: Path, epochs: int) -> None:
    """One run (``bare`` or ``monitor``) in this process; writes its figures to ``out``."""
    torch.manual_seed(0)
    np.random.seed(0)
    # One compute thread and one worker on two cores: with two OpenMP threads every parallel
    # region waits at its barrier for a thread the OS has descheduled, and on a shared machine
    # that noise would swamp the overhead being measured.
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    images = data / "images"
    train_ds = JpegDataset(_items(data / "train.csv", images), train=True)
    val_ds = JpegDataset(_items(data / "valid.csv", images), train=False)
    common: dict[str, Any] = {"batch_size": BATCH_SIZE, "num_workers": 1, "prefetch_factor": 2}
    train = DataLoader(train_ds, shuffle=True, **common)
    val = DataLoader(val_ds, **common)
    model = timm.create_model(MODEL, pretrained=False, num_classes=2)
    if kind == "bare":
        figures = _loop(_Bare(), model, train, val, epochs)
    else:
        from stepscope import Monitor

        files = sorted(images.iterdir())
        run_dir = out.with_suffix(".run")
        started = time.perf_counter()
        with Monitor(run_dir, dataset_files=files, interval_s=1.0, kind="train") as mon:
            figures = _loop(mon, model, train, val, epochs)
        figures["run_s"] = time.perf_counter() - started
        figures["monitor_cpu_s"] = _monitor_cpu_s(run_dir)
    out.write_text(json.dumps(figures))


def _monitor_cpu_s(run_dir: Path) -> float:
    """CPU seconds of the Monitor's own sampler and writer threads (the ``monitor.cpu_s`` fact):
    their cost measured directly, which other load on the machine barely disturbs."""
    from stepscope.store.db import RunReader

    with RunReader(run_dir) as r:
        fact = r.facts().get("monitor.cpu_s")
    return float(fact.value) if fact is not None else float("nan")


def _run(data: Path, work: Path, index: int, kind: str, epochs: int) -> dict[str, float]:
    out = work / f"result-{index}-{kind}.json"
    cmd = [sys.executable, __file__, "--child", kind, "--data", str(data), "--out", str(out),
           "--epochs", str(epochs)]
    # Both in a new session: with autogroup scheduling a new session is a new CPU-share group,
    # so both kinds compete with the rest of the machine on the same terms.
    subprocess.run(cmd, check=True, start_new_session=True)
    return {k: float(v) for k, v in json.loads(out.read_text()).items()}


def _bench(args: argparse.Namespace) -> None:
    from stepscope.train.synth import synth_dataset

    ratios: list[float] = []
    cpu_ratios: list[float] = []
    sampler_fracs: list[float] = []
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="stepscope-overhead-") as tmp:
        work = Path(tmp)
        synth_dataset(work / "data", images=args.images, seed=0)
        for i in range(max(args.pairs, 5)):
            order = ("bare", "monitor") if i % 2 == 0 else ("monitor", "bare")
            res = {k: _run(work / "data", work, i, k, args.epochs) for k in order}
            bare, inst = res["bare"], res["monitor"]
            ratios.append(inst["images_per_s"] / bare["images_per_s"])
            cpu_ratios.append(inst["cpu_s_per_image"] / bare["cpu_s_per_image"])
            sampler_fracs.append(inst["monitor_cpu_s"] / inst["run_s"])
            print(f"pair {i}: bare {bare['images_per_s']:.1f} img/s ({bare['wall_s']:.1f} s), "
                  f"instrumented {inst['images_per_s']:.1f} img/s ({inst['wall_s']:.1f} s), "
                  f"ratio {ratios[-1]:.4f}; CPU per image instrumented/bare "
                  f"{cpu_ratios[-1]:.4f}; sampler threads {100 * sampler_fracs[-1]:.2f} % of a "
                  f"core; load average {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)
    print(f"instrumented/bare throughput: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}) over {len(ratios)} pairs; CPU per "
          f"image instrumented/bare median {statistics.median(cpu_ratios):.4f}; the Monitor's "
          f"sampler and writer threads used {100 * statistics.median(sampler_fracs):.2f} % of "
          f"one core (median); load average "
          f"{load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end on "
          f"{len(os.sched_getaffinity(0))} cores")
    print(json.dumps({"figure": "overhead_ratio", "value": round(statistics.median(ratios), 4),
                      "min": round(min(ratios), 4), "max": round(max(ratios), 4),
                      "runs": len(ratios)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="bare/instrumented pairs (>= 5)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run")
    parser.add_argument("--images", type=int, default=160, help="dataset size (80 %% train)")
    parser.add_argument("--child", choices=("bare", "monitor"), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child, args.data, args.out, args.epochs)
    else:
        _bench(args)


if __name__ == "__main__":
    main()
