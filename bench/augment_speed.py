"""How many images per second ONE core turns into augmented 299 px training tensors, by path.

Same files, one process, one thread (OpenCV and torch pinned to one), the seed's augmentation
(rotation 30°, shifts 0.4, shear 0.4°, zoom 0.25, horizontal flip, brightness 0.5-1.5). Every
figure includes reading the file from the page cache and decoding it, as a DataLoader worker
does; the files are read once before timing.

- fused: stepscope's fused backend (one OpenCV warp from the decoded source + brightness LUT).
- keras_ref: stepscope's `keras` backend (Pillow nearest resize + SciPy affine per channel).
- keras_idg: Keras 3's own ImageDataGenerator code (keras.src.legacy.preprocessing.image, the
  seed's pipeline, KERAS_BACKEND=torch): load_img(target_size) + img_to_array +
  get_random_transform + apply_transform + standardize, exactly its per-image loop.
- torchvision_v2: Pillow decode, v2.Resize + RandomAffine + RandomHorizontalFlip + ColorJitter
  (brightness) on uint8 tensors.
- gpu_backend_on_cpu: stepscope's `gpu` backend with its device part run on the CPU (decode +
  resize per image, then one batched affine_grid/grid_sample per 8 images). On a GPU the second
  half leaves the CPU entirely; this row only shows what it costs where no GPU is.

Runs are interleaved (round r runs every path once) so machine noise hits all paths alike; each
figure is the median over rounds, with min and max. The last line is the headline: the fused
path's images/s per core.

Usage:
    .venv/bin/python bench/augment_speed.py [--runs 3] [--seconds 2] [--images 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported anywhere

import cv2
import numpy as np
import torch
from PIL import Image

from stepscope.train import augment
from stepscope.train.gpuaug import GpuAugment
from stepscope.train.synth import synth_dataset

SIZE = 299
BATCH = 8

PerBatch = Callable[[list[Path]], None]


def _per_image(tf: Callable[[Path], object]) -> PerBatch:
    def run(batch: list[Path]) -> None:
        for p in batch:
            tf(p)

    return run


def fused(files: list[Path]) -> PerBatch:
    return _per_image(augment.create_transform(augment.SEED_AUGMENT, SIZE, train=True,
                                               backend="fused", seed=0))


def keras_ref(files: list[Path]) -> PerBatch:
    return _per_image(augment.create_transform(augment.SEED_AUGMENT, SIZE, train=True,
                                               backend="keras", seed=0))


def keras_idg(files: list[Path]) -> PerBatch:
    from keras.src.legacy.preprocessing.image import ImageDataGenerator
    from keras.src.utils import image_utils

    gen = ImageDataGenerator(
        rotation_range=30, width_shift_range=0.4, height_shift_range=0.4, shear_range=0.4,
        zoom_range=0.25, horizontal_flip=True, brightness_range=(0.5, 1.5), fill_mode="nearest",
    )

    def run(batch: list[Path]) -> None:
        for p in batch:
            img = image_utils.load_img(p, target_size=(SIZE, SIZE), interpolation="nearest")
            x = image_utils.img_to_array(img)
            img.close()
            x = gen.apply_transform(x, gen.get_random_transform(x.shape))
            gen.standardize(x)

    return run


def torchvision_v2(files: list[Path]) -> PerBatch:
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as tvf

    tf = v2.Compose([
        v2.Resize((SIZE, SIZE)),
        v2.RandomAffine(degrees=30, translate=(0.4, 0.4), scale=(0.75, 1.25), shear=0.4),
        v2.RandomHorizontalFlip(),
        v2.ColorJitter(brightness=0.5),
    ])

    def run(batch: list[Path]) -> None:
        for p in batch:
            with Image.open(p) as img:
                tf(tvf.pil_to_tensor(img.convert("RGB")))

    return run


def gpu_backend_on_cpu(files: list[Path]) -> PerBatch:
    decode = augment.create_transform(None, SIZE, train=False, backend="fused")
    aug = GpuAugment(augment.SEED_AUGMENT, seed=0)

    def run(batch: list[Path]) -> None:
        aug(torch.stack([decode(p) for p in batch]))

    return run


PATHS: dict[str, Callable[[list[Path]], PerBatch]] = {
    "fused": fused, "keras_ref": keras_ref, "keras_idg": keras_idg,
    "torchvision_v2": torchvision_v2, "gpu_backend_on_cpu": gpu_backend_on_cpu,
}


def rate(run: PerBatch, files: list[Path], seconds: float) -> float:
    """Images/s over whole batches for ``seconds`` (after one untimed warm-up batch)."""
    run(files[:BATCH])
    done, cursor, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or done < 2 * BATCH:
        batch = [files[(cursor + i) % len(files)] for i in range(BATCH)]
        cursor += BATCH
        run(batch)
        done += BATCH
    return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="time per path per round")
    ap.add_argument("--images", type=int, default=48, help="synthetic JPEGs to cycle through")
    args = ap.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="stepscope-augbench-") as tmp:
        synth_dataset(Path(tmp), images=args.images, seed=0)
        files = sorted((Path(tmp) / "images").glob("*.jpg"))
        for f in files:
            f.read_bytes()  # into the page cache: this measures the CPU, not the disk
        runners = {name: make(files) for name, make in PATHS.items()}
        rates: dict[str, list[float]] = {name: [] for name in PATHS}
        for r in range(args.runs):
            for name, run in runners.items():
                rates[name].append(rate(run, files, args.seconds))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in rates.items()),
                  flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    med = {n: statistics.median(v) for n, v in rates.items()}
    for name, values in rates.items():
        print(f"{name:20s} {med[name]:7.0f} img/s/core  (min {min(values):.0f}, max "
              f"{max(values):.0f}; {med['fused'] / med[name]:.1f}x slower than fused)"
              if name != "fused" else f"{name:20s} {med[name]:7.0f} img/s/core  "
              f"(min {min(values):.0f}, max {max(values):.0f})")
    for name in ("keras_idg", "torchvision_v2"):
        print(json.dumps({"figure": f"augment_{name}_img_per_s_core_{SIZE}",
                          "value": round(med[name], 1), "min": round(min(rates[name]), 1),
                          "max": round(max(rates[name]), 1), "runs": args.runs}))
    values = rates["fused"]
    print(json.dumps({"figure": f"augment_fused_img_per_s_core_{SIZE}", "value": round(med["fused"], 1),
                      "min": round(min(values), 1), "max": round(max(values), 1),
                      "runs": args.runs, "vs_keras_idg": round(med["fused"] / med["keras_idg"], 1)}))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
