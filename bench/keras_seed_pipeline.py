"""The seed's own Keras pipeline, as written in its question, run with Keras 3.

ImageDataGenerator.flow_from_dataframe with the seed's exact arguments, a frozen
InceptionResNetV2 trunk (random weights here: there is no network, and speed does not depend on
the values) with ``pooling='avg'``, Dense(1, sigmoid), Adam 1e-4, binary cross-entropy,
ModelCheckpoint(save_best_only=True on val_accuracy), validation every epoch.

Differences from the seed, all forced by Keras 3 and named here:
- ``fit_generator`` is gone: ``fit`` takes the generators; ``Adam(lr=)`` is ``learning_rate=``;
  ``ModelCheckpoint(period=1)`` is the default ``save_freq='epoch'``.
- ImageDataGenerator lives on as ``keras.src.legacy.preprocessing.image`` (same code).
- The backend is whatever ``KERAS_BACKEND`` says. The seed ran TensorFlow; where only PyTorch
  is installed (this project's machines) run it with ``KERAS_BACKEND=torch``. With
  ``tensorflow-cpu`` installed, ``KERAS_BACKEND=tensorflow`` is the faithful choice.
- Keras 3 loads batches in the training thread when ``workers=1`` (TF 2.0's ``fit_generator``
  kept one background thread filling a queue of 10). ``--workers N`` (N > 1) gives Keras N
  loader threads, a fairer and usually faster Keras than the seed's code gets by default.

Requirements: bench/requirements-keras.txt (keras>=3, pandas, scipy, pillow, h5py, and a backend).

Usage:
    KERAS_BACKEND=torch python bench/keras_seed_pipeline.py --data DIR --epochs 3 --out DIR
where DIR holds train.csv, valid.csv (columns Photo, Class) and images/ (``stepscope data synth``).
The last line printed is one JSON object: {"fit_s": ..., "epochs": ..., "val_accuracy": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# Keras reads its backend once, at import: choose it first (torch: TensorFlow is not installed).
os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import pandas as pd
from keras.applications.inception_resnet_v2 import InceptionResNetV2, preprocess_input
from keras.callbacks import ModelCheckpoint
from keras.layers import Dense
from keras.models import Model
from keras.src.legacy.preprocessing.image import ImageDataGenerator


def generators(data: Path, img_size: int, batch_size: int, workers: int) -> tuple[object, object]:
    """The seed's two generators, argument for argument."""
    train_datagen = ImageDataGenerator(rotation_range=30,
                                       width_shift_range=0.4,
                                       height_shift_range=0.4,
                                       shear_range=0.4,
                                       zoom_range=0.25,
                                       horizontal_flip=True,
                                       brightness_range=[0.5, 1.5],
                                       preprocessing_function=preprocess_input)
    valid_datagen = ImageDataGenerator(preprocessing_function=preprocess_input)
    common = {"directory": str(data / "images"), "x_col": "Photo", "y_col": "Class",
              "target_size": (img_size, img_size), "class_mode": "binary", "seed": 42,
              "batch_size": batch_size}
    train_generator = train_datagen.flow_from_dataframe(pd.read_csv(data / "train.csv"), **common)
    validation_generator = valid_datagen.flow_from_dataframe(pd.read_csv(data / "valid.csv"),
                                                             **common)
    for gen in (train_generator, validation_generator):
        gen.workers = workers  # Keras 3's PyDataset: > 1 starts a thread pool, 1 loads inline
    return train_generator, validation_generator


def build_model(img_size: int) -> Model:
    """The seed's model: frozen InceptionResNetV2 (avg pooling) + Dense(1, sigmoid)."""
    inception_resnet_v2 = InceptionResNetV2(include_top=False,
                                            weights=None,  # the seed: 'imagenet' (no network)
                                            input_shape=(img_size, img_size, 3),
                                            pooling="avg",
                                            classes=2)
    inception_resnet_v2.trainable = False
    out = Dense(1, activation="sigmoid")(inception_resnet_v2.output)
    model = Model(inputs=inception_resnet_v2.inputs, outputs=out)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.0001),
                  loss="binary_crossentropy", metrics=["accuracy"])
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="folder with train.csv, valid.csv and images/")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--img-size", type=int, default=299)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1,
                    help="Keras loader threads (1: inline, Keras 3's default)")
    ap.add_argument("--out", type=Path, default=Path("keras-run"),
                    help="folder for the checkpoint (model.h5, as the seed)")
    ap.add_argument("--verbose", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train_generator, validation_generator = generators(args.data, args.img_size,
                                                       args.batch_size, args.workers)
    model = build_model(args.img_size)
    checkpoint = ModelCheckpoint(str(args.out / "model.h5"), monitor="val_accuracy", verbose=0,
                                 save_best_only=True, save_weights_only=False, mode="max")
    t0 = time.perf_counter()
    hist = model.fit(train_generator, steps_per_epoch=len(train_generator), epochs=args.epochs,
                     callbacks=[checkpoint], validation_data=validation_generator,
                     verbose=args.verbose, validation_steps=len(validation_generator),
                     validation_freq=1)
    fit_s = time.perf_counter() - t0
    print(json.dumps({"fit_s": fit_s, "epochs": args.epochs, "backend": keras.backend.backend(),
                      "val_accuracy": [float(v) for v in hist.history.get("val_accuracy", [])]}))


if __name__ == "__main__":
    main()
