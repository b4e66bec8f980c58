"""How close does `stepscope train` come to the speed of its own compute?

Pipeline: a real `train()` run (workers auto, the seed's augmentation, fused backend, frozen
trunk, weights none, the precision and channels_last setup picks), training phase only; its
rate is images / wall time over the run database's steady-state training steps (warm-up steps
left out), i.e. everything a step costs: waiting for data, copy, compute and the loop's rest.

Ceiling: the same model, precision, channels_last and thread count doing only the training
step's compute (uint8 → normalise → frozen trunk → head forward, loss, backward, Adam step) on
batches already in memory, median over timed batches.

efficiency = pipeline / ceiling (1.0: the input pipeline costs nothing). Runs alternate ceiling
and pipeline so a noisy machine hits both alike; the headline is the median of the per-run
ratios, with min and max. The last line is that headline as one JSON object.

Usage:
    .venv/bin/python bench/pipeline_efficiency.py [--model efficientnet_lite0] [--runs 3]
        [--images 400] [--img-size 299] [--threads N] [--workers auto|N] [--ceiling-seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from stepscope.store.db import RunReader
from stepscope.train import augment, precision, setup
from stepscope.train.config import resolve_config
from stepscope.train.loop import train
from stepscope.train.models import create_model
from stepscope.train.synth import synth_dataset

BATCH = 8


def ceiling_img_s(model_name: str, files: list[Path], *, img_size: int, bf16: bool,
                  channels_last: bool, threads: int, seconds: float) -> float:
    """Median images/s of the training step's compute alone, on real decoded batches."""
    torch.set_num_threads(threads)
    model = create_model(model_name, weights="none")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train(True)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    loss_fn = model.loss_fn()
    decode = augment.create_transform(None, img_size, train=False, backend="fused")
    xs = [torch.stack([decode(p) for p in files[i : i + BATCH]])
          for i in range(0, 4 * BATCH, BATCH)]
    if channels_last:
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    y = torch.tensor([0, 1] * (BATCH // 2))
    cpu = torch.device("cpu")

    def step(x: torch.Tensor) -> None:
        with precision.autocast_context(cpu, bf16):
            logits = model(x)
        loss = loss_fn(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for x in xs[:3]:  # warm-up: oneDNN builds its kernels on the first calls
        step(x)
    times: list[float] = []
    spent = 0.0
    while spent < seconds or len(times) < 5:
        t0 = time.perf_counter()
        step(xs[len(times) % len(xs)])
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return BATCH / statistics.median(times)


def pipeline_img_s(data: Path, out: Path, *, model_name: str, img_size: int,
                   threads: int | None, workers: str = "auto") -> tuple[float, int]:
    """Steady-state training images/s of a real run, and the workers it used."""
    cfg = resolve_config({
        "csv": str(data / "train.csv"), "val_csv": str(data / "valid.csv"),
        "images": str(data / "images"), "model": model_name, "weights": "none",
        "augment": "seed", "aug_backend": "fused", "img_size": img_size, "batch_size": BATCH,
        "epochs": 1, "val_every": 2,  # no validation phase: the training phase is measured
        "threads": threads, "out": str(out), "workers": workers,
    })
    run = train(cfg).run_dir
    reader = RunReader(run)
    phase = next(p for p in reader.phases() if p.phase == "train")
    steps = [s for s in reader.steps(phase.phase_id) if not s.warmup]
    workers = int(reader.facts()["loader.workers"].value)
    return sum(s.images for s in steps) / sum(s.wall_s for s in steps), workers


def _figure(name: str, values: list[float], runs: int) -> str:
    return json.dumps({"figure": name, "value": round(statistics.median(values), 3),
                       "min": round(min(values), 3), "max": round(max(values), 3), "runs": runs})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", type=int, default=400, help="synthetic images (80 %% train)")
    ap.add_argument("--img-size", type=int, default=299)
    ap.add_argument("--threads", type=int, default=None, help="default: what train picks")
    ap.add_argument("--workers", default="auto", help="DataLoader workers (default: auto)")
    ap.add_argument("--ceiling-seconds", type=float, default=8.0)
    args = ap.parse_args()
    threads = args.threads or setup.usable_cores()
    bf16 = precision.bf16_pays(torch.device("cpu"))
    ratios, pipes, ceils = [], [], []
    with tempfile.TemporaryDirectory(prefix="stepscope-pipebench-") as tmp:
        data = Path(tmp) / "data"
        synth_dataset(data, images=args.images, seed=0)
        files = sorted((data / "images").glob("*.jpg"))
        for r in range(args.runs):
            ceil = ceiling_img_s(args.model, files, img_size=args.img_size, bf16=bf16,
                                 channels_last=True, threads=threads,
                                 seconds=args.ceiling_seconds)
            pipe, workers = pipeline_img_s(data, Path(tmp) / f"run{r}", model_name=args.model,
                                           img_size=args.img_size, threads=args.threads,
                                           workers=args.workers)
            ceils.append(ceil)
            pipes.append(pipe)
            ratios.append(pipe / ceil)
            print(f"run {r + 1}: pipeline {pipe:.1f} img/s ({workers} worker(s)), compute ceiling "
                  f"{ceil:.1f} img/s, efficiency {pipe / ceil:.3f}", flush=True)
    print(f"{args.model} @ {args.img_size} px, batch {BATCH}, {threads} trunk thread(s), "
          f"{'bf16' if bf16 else 'fp32'}, channels_last; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    tag = f"{args.model.replace('efficientnet_', '')}_{args.img_size}"
    print(_figure(f"pipeline_img_per_s_{tag}", pipes, args.runs))
    print(_figure(f"compute_ceiling_img_per_s_{tag}", ceils, args.runs))
    print(_figure(f"pipeline_efficiency_{tag}", ratios, args.runs))


if __name__ == "__main__":
    main()
