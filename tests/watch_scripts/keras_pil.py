"""Keras's PyDataset guide, as its example writes one: ``__getitem__`` reads each image file and
resizes it (PIL here), in worker processes (``workers``: the job's cores,
``use_multiprocessing=True``), feeding a small CNN on Keras 3 / TensorFlow.

    python keras_pil.py IMAGES_DIR [--epochs E] [--images N] [--once]

--once: the remedy stepscope advises where decoding and resizing cost the most: decode and
resize every image once, into an array ``__getitem__`` indexes.
--threads: the workers as threads (``use_multiprocessing=False``).
"""

from __future__ import annotations

import argparse
import glob
import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
from PIL import Image

SIDE = 96

p = argparse.ArgumentParser()
p.add_argument("images")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--images-n", "--images", dest="n", type=int, default=960)
p.add_argument("--once", action="store_true")
p.add_argument("--threads", action="store_true", help="workers as threads, not processes")
args = p.parse_args()


def load(name: str) -> np.ndarray:
    return np.asarray(Image.open(name).convert("RGB").resize((SIDE, SIDE)), np.float32) / 255.0


class Files(keras.utils.PyDataset):
    def __init__(self, names: list[str], batch_size: int, once: bool, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.names, self.batch_size = names, batch_size
        self.labels = np.array([int("dog" in os.path.basename(n)) for n in names], np.float32)
        self.decoded = np.stack([load(n) for n in names]) if once else None

    def __len__(self) -> int:
        return math.ceil(len(self.names) / self.batch_size)

    def __getitem__(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = idx * self.batch_size, (idx + 1) * self.batch_size
        if self.decoded is not None:
            return self.decoded[lo:hi], self.labels[lo:hi]
        return np.stack([load(n) for n in self.names[lo:hi]]), self.labels[lo:hi]


names = sorted(glob.glob(os.path.join(args.images, "*.jpg")))[:args.n]
workers = len(os.sched_getaffinity(0))
data = Files(names, 32, args.once, workers=workers, use_multiprocessing=not args.threads)
model = keras.Sequential([
    keras.Input((SIDE, SIDE, 3)),
    keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(1, activation="sigmoid"),
])
model.compile("adam", "binary_crossentropy")
model.fit(data, epochs=args.epochs, verbose=2)
