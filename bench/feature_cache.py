"""What the frozen trunk's feature cache saves, in real `stepscope train` runs.

1. `--augment none`, frozen trunk, 3 epochs: epoch 1 computes every feature (train and val), and
   epochs 2-3 run the head alone on cached features. Figure: epoch 1's seconds ÷ the median of
   the later epochs' seconds (metrics.csv `seconds`: the whole epoch as the user waits for it,
   train + val + checkpoint writes). Target ≥ 20.
2. `--augment seed` (training images change every epoch, validation images do not), 2 epochs:
   validation's seconds in epoch 2 as a fraction of epoch 1's (phase start to end, from the run
   database). Target ≤ 0.05.

Each is repeated `--runs` times; figures are medians with min and max. Figure 2 is printed
first, the headline (figure 1) last, each as one JSON object.

Usage:
    .venv/bin/python bench/feature_cache.py [--runs 3] [--images 400] [--img-size 299]
        [--model efficientnet_lite0] [--threads N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from stepscope.store.db import RunReader
from stepscope.train.config import resolve_config
from stepscope.train.loop import train
from stepscope.train.synth import synth_dataset


def _run(data: Path, out: Path, args: argparse.Namespace, **flags: Any) -> Path:
    cfg = resolve_config({
        "csv": str(data / "train.csv"), "val_csv": str(data / "valid.csv"),
        "images": str(data / "images"), "model": args.model, "weights": "none",
        "img_size": args.img_size, "threads": args.threads, "out": str(out), **flags,
    })
    return train(cfg).run_dir


def epoch_speedup(data: Path, out: Path, args: argparse.Namespace) -> tuple[float, list[float]]:
    run = _run(data, out, args, augment="none", epochs=3)
    seconds = [float(r["seconds"]) for r in csv.DictReader((run / "metrics.csv").open())]
    return seconds[0] / statistics.median(seconds[1:]), seconds


def val_fraction(data: Path, out: Path, args: argparse.Namespace) -> tuple[float, list[float]]:
    run = _run(data, out, args, augment="seed", epochs=2)
    val = [p.ended - p.started for p in RunReader(run).phases()
           if p.phase == "val" and p.ended is not None]
    return val[1] / val[0], val


def _figure(name: str, values: list[float], runs: int) -> str:
    return json.dumps({"figure": name, "value": round(statistics.median(values), 4),
                       "min": round(min(values), 4), "max": round(max(values), 4), "runs": runs})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", type=int, default=400, help="synthetic images (80 %% train)")
    ap.add_argument("--img-size", type=int, default=299)
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--threads", type=int, default=None, help="default: what train picks")
    args = ap.parse_args()
    speedups, fractions = [], []
    with tempfile.TemporaryDirectory(prefix="stepscope-cachebench-") as tmp:
        data = Path(tmp) / "data"
        synth_dataset(data, images=args.images, seed=0)
        for r in range(args.runs):
            ratio, seconds = epoch_speedup(data, Path(tmp) / f"none{r}", args)
            frac, val_s = val_fraction(data, Path(tmp) / f"seed{r}", args)
            speedups.append(ratio)
            fractions.append(frac)
            print(f"run {r + 1}: augment none, epoch seconds {[round(s, 3) for s in seconds]} "
                  f"-> {ratio:.0f}x; augment seed, val seconds {[round(s, 3) for s in val_s]} "
                  f"-> {frac:.4f}", flush=True)
    print(f"{args.model} @ {args.img_size} px, {args.images} images, frozen trunk; load average "
          f"at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(_figure("featcache_val_epoch2_frac_of_epoch1", fractions, args.runs))
    print(_figure("featcache_epoch_speedup_augment_none", speedups, args.runs))


if __name__ == "__main__":
    main()
