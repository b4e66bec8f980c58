"""Keras's ModelCheckpoint saving a ~250 MB model (two wide Dense layers and Adam's state) at
every epoch's end, as the Keras docs write it, with the script's own clock around it.

    python keras_checkpoint.py OUT_DIR [--epochs E] [--best-only] [--weights-only]
        [--save-freq N]

``--save-freq N``: save every N batches (ModelCheckpoint's ``save_freq``), inside the epoch.

Two callbacks of the script's own sit either side of the ModelCheckpoint in ``callbacks``, which
Keras calls in order, so the time from the first's ``on_epoch_end`` to the second's is the
checkpoint's: printed as ``SAVE epoch=E seconds=S``, the truth the test holds watch's figures to.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--best-only", action="store_true")
p.add_argument("--weights-only", action="store_true")
p.add_argument("--save-freq", type=int, default=0)
args = p.parse_args()

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 512)).astype("float32")
y = rng.integers(0, 2, size=(256,)).astype("float32")
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(8192, activation="relu"),
                          keras.layers.Dense(2048, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])

ends: dict[int, float] = {}


class Before(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        ends[epoch] = time.perf_counter()


class After(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        print(f"SAVE epoch={epoch + 1} seconds={time.perf_counter() - ends[epoch]:.4f}",
              flush=True)


name = "model.weights.h5" if args.weights_only else "model.keras"
checkpoint = keras.callbacks.ModelCheckpoint(os.path.join(args.out, name), monitor="val_accuracy",
                                             save_best_only=args.best_only, mode="max",
                                             save_weights_only=args.weights_only,
                                             save_freq=args.save_freq or "epoch")
model.fit(x, y, batch_size=64, epochs=args.epochs, validation_split=0.25, verbose=2,
          callbacks=[Before(), checkpoint, After()])
