"""Keras (any backend) + stepscope: one callback, and the run explains itself at the end of fit.

    KERAS_BACKEND=tensorflow python examples/keras_callback.py --out runs/keras --load-ms 20
    TF_USE_LEGACY_KERAS=1 python examples/keras_callback.py --out runs/tf-keras   # tf-keras

``--load-ms`` makes every image of the ``PyDataset`` take that long to load (a stand-in for
slow decoding or a slow disk), so the run is input-bound. ``--arrays`` feeds in-memory NumPy
arrays to a heavier convolutional model instead: compute-bound.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # Keras 2 as tf.keras (the tf-keras package)
    import tf_keras as keras
else:
    import keras

import stepscope.keras

SIZE = 32


# Keras 3's PyDataset; tf-keras has its predecessor, Sequence.
_Batches = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence


class Shapes(_Batches):
    """Batches of random images; ``load_s`` per image stands for decoding."""

    def __init__(self, n: int, batch_size: int, load_s: float) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(n, SIZE, SIZE, 3)).astype("float32")
        self.y = (self.x.mean(axis=(1, 2, 3)) > 0).astype("int32")
        self.batch_size, self.load_s = batch_size, load_s

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        sl = slice(i * self.batch_size, (i + 1) * self.batch_size)
        if self.load_s:
            time.sleep(self.load_s * len(self.x[sl]))
        return self.x[sl], self.y[sl]


def tiny_model(filters: int) -> keras.Model:
    return keras.Sequential([
        keras.Input(shape=(SIZE, SIZE, 3)),
        keras.layers.Conv2D(filters, 3, activation="relu"),
        keras.layers.Conv2D(filters, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, activation="softmax"),
    ])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/keras")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--images", type=int, default=160)
    ap.add_argument("--load-ms", type=float, default=20.0)
    ap.add_argument("--arrays", action="store_true", help="NumPy arrays and a heavier model")
    args = ap.parse_args()
    callback = stepscope.keras.Callback(out=args.out)
    if args.arrays:
        train, val = Shapes(args.images, 8, 0.0), Shapes(args.images // 4, 8, 0.0)
        model = tiny_model(96)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(train.x, train.y, batch_size=8, epochs=args.epochs,
                  validation_data=(val.x, val.y), callbacks=[callback], verbose=2)
    else:
        train = Shapes(args.images, 8, args.load_ms / 1000)
        val = Shapes(args.images // 4, 8, 0.0)
        model = tiny_model(8)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(train, epochs=args.epochs, validation_data=val, callbacks=[callback],
                  verbose=2)


if __name__ == "__main__":
    main()
