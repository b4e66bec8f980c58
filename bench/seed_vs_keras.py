"""The seed's workload, end to end: its own Keras pipeline against ``stepscope train``, same images.

Both sides train InceptionResNetV2 (random init: no network here, and speed does not depend on
the weights) at 299 px, batch 8, the seed's augmentation, ``--epochs`` epochs with validation
after each, a checkpoint on the best val_accuracy. Each side runs as its own process, timed from
start to exit (imports, model build, training, validation, checkpoints: what the user waits
for), alternately (Keras, stepscope, then stepscope, Keras, ...) so a change in the machine's
load hits both sides alike.

- Keras side: bench/keras_seed_pipeline.py (the seed's ImageDataGenerator + Keras model) with
  Keras 3 on ``KERAS_BACKEND`` (default ``torch``: TensorFlow is not installed here;
  ``tensorflow-cpu`` with ``KERAS_BACKEND=tensorflow`` is the faithful backend where installed).
- stepscope side: ``python -m stepscope train --model inception_resnet_v2 --weights none
  --augment seed --img-size 299 --batch-size 8``, everything else default (the fast path:
  fused augmentation, workers auto, bf16 where it pays, channels_last, recording on).

Prints each run, the ratio keras_s / stepscope_s per round, the load average, and as the last
line one JSON object: {"figure": "seed_vs_keras_speedup", "value": ..., "min": ..., "max": ...,
"runs": N} (median, min and max over rounds).

Usage:
    .venv/bin/python bench/seed_vs_keras.py [--images 200] [--epochs 3] [--runs 2]
    .venv/bin/python bench/seed_vs_keras.py --epochs 1 --images 200   # quicker
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
from pathlib import Path

from stepscope.train.synth import synth_dataset

HERE = Path(__file__).resolve().parent


def keras_cmd(data: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(HERE / "keras_seed_pipeline.py"), "--data", str(data),
            "--epochs", str(args.epochs), "--img-size", str(args.img_size),
            "--batch-size", str(args.batch_size), "--workers", str(args.keras_workers),
            "--out", str(out), "--verbose", "2"]


def stepscope_cmd(data: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "stepscope", "train",
            "--csv", str(data / "train.csv"), "--val-csv", str(data / "valid.csv"),
            "--images", str(data / "images"), "--model", args.model, "--weights", "none",
            "--augment", "seed", "--img-size", str(args.img_size),
            "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--out", str(out)]


def timed(cmd: list[str], env: dict[str, str], log: Path) -> float:
    """Run ``cmd`` to completion, output to ``log``; its wall time in seconds."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        sys.exit(f"{cmd[1]} failed (exit {proc.returncode}) after {wall_s:.0f} s:\n{tail}")
    return wall_s


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200, help="synthetic images (80%% train)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2, help="rounds (one run of each side per round)")
    ap.add_argument("--img-size", type=int, default=299)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--model", default="inception_resnet_v2", help="stepscope's timm name")
    ap.add_argument("--keras-workers", type=int, default=1,
                    help="Keras loader threads (1: Keras 3's default, inline)")
    ap.add_argument("--data", type=Path, help="existing dataset (train.csv, valid.csv, images/)")
    ap.add_argument("--keep", type=Path, help="keep runs and logs here")
    args = ap.parse_args()
    env = {**os.environ, "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "torch")}
    with tempfile.TemporaryDirectory(prefix="seed-vs-keras-") as tmp_s:
        work = args.keep or Path(tmp_s)
        work.mkdir(parents=True, exist_ok=True)
        data = args.data or work / "data"
        if args.data is None:
            synth_dataset(data, images=args.images, seed=0)
        n_train = sum(1 for _ in (data / "train.csv").open()) - 1
        n_val = sum(1 for _ in (data / "valid.csv").open()) - 1
        print(f"{n_train} train + {n_val} val images, {args.epochs} epoch(s), {args.img_size} px, "
              f"batch {args.batch_size}; Keras backend {env['KERAS_BACKEND']}; {load()}",
              flush=True)
        ratios: list[float] = []
        for r in range(args.runs):
            sides = [("keras", keras_cmd), ("stepscope", stepscope_cmd)]
            walls: dict[str, float] = {}
            for name, make in sides if r % 2 == 0 else sides[::-1]:
                out = work / f"{name}-{r}"
                walls[name] = timed(make(data, out, args), env, work / f"{name}-{r}.log")
                print(f"round {r + 1}: {name:<9} {walls[name]:7.1f} s  ({load()})", flush=True)
            ratios.append(walls["keras"] / walls["stepscope"])
            print(f"round {r + 1}: keras/stepscope = {ratios[-1]:.2f}x", flush=True)
    print(f"speed-up keras_s / stepscope_s: median {statistics.median(ratios):.2f}x, "
          f"min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} round(s)")
    print(json.dumps({"figure": "seed_vs_keras_speedup", "value": round(statistics.median(ratios), 3),
                      "min": round(min(ratios), 3), "max": round(max(ratios), 3),
                      "runs": len(ratios)}))


if __name__ == "__main__":
    main()
