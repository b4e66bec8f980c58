"""Keras's "Image classification from scratch" example, shrunk for two CPU cores.

    python keras_folder.py DIR [--epochs E] [--side PX] [--augment-val]

``keras.utils.image_dataset_from_directory`` over ``DIR/train`` and ``DIR/valid`` (one folder per
class), random flips and rotations in a ``tf.data`` map with ``num_parallel_calls=AUTOTUNE``,
``prefetch(AUTOTUNE)`` on both, and a small convolutional net, on Keras 3 with TensorFlow, as the
example writes it: the files are decoded by tf.data's own threads each epoch.
"""

from __future__ import annotations

import argparse
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
from keras import layers
from tensorflow import data as tf_data

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--side", type=int, default=64)
p.add_argument("--augment-val", action="store_true",
               help="map the augmentation over the validation dataset too (a planted mistake)")
args = p.parse_args()

image_size = (args.side, args.side)
train_ds = keras.utils.image_dataset_from_directory(
    os.path.join(args.dir, "train"), seed=1337, image_size=image_size, batch_size=32)
val_ds = keras.utils.image_dataset_from_directory(
    os.path.join(args.dir, "valid"), seed=1337, image_size=image_size, batch_size=32)

augmentation = [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)]


def augment(images):  # type: ignore[no-untyped-def]
    for layer in augmentation:
        images = layer(images)
    return images


train_ds = train_ds.map(lambda img, label: (augment(img), label),
                        num_parallel_calls=tf_data.AUTOTUNE).prefetch(tf_data.AUTOTUNE)
if args.augment_val:
    val_ds = val_ds.map(lambda img, label: (augment(img), label))
val_ds = val_ds.prefetch(tf_data.AUTOTUNE)

inputs = keras.Input(shape=(*image_size, 3))
x = layers.Rescaling(1.0 / 255)(inputs)
for size in (16, 32):
    x = layers.Conv2D(size, 3, strides=2, padding="same", activation="relu")(x)
x = layers.GlobalAveragePooling2D()(x)
model = keras.Model(inputs, layers.Dense(1)(x))
model.compile(optimizer=keras.optimizers.Adam(3e-4),
              loss=keras.losses.BinaryCrossentropy(from_logits=True), metrics=["acc"])
model.fit(train_ds, epochs=args.epochs, validation_data=val_ds, verbose=2)
