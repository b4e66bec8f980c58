"""The Keras transfer-learning guide's input and model, on a folder of images (one folder per
class, read by ``keras.utils.image_dataset_from_directory``): random augmentation layers mapped
over the images, then ``.batch().prefetch().cache()``, as the guide orders them; a frozen
convolutional base called with ``training=False`` under a new head.

Planted truth: the augmentation map runs before the cache, so the cache keeps epoch 1's
augmented images and every later epoch replays them. ``--cache-first`` caches the decoded images
and maps the augmentation after the cache (each epoch augments anew). ``--check`` trains nothing:
it runs the pipeline through two whole epochs and prints ``replayed: True`` where the second
epoch's first batch is the first epoch's, the truth a test holds stepscope's answer to.
``--no-cache`` leaves the cache out: the augmentation map, given no ``num_parallel_calls`` as in
the guide, then runs one call at a time every epoch (its random layers hold a stateful op, so
tf.data does not parallelize it); ``--parallel`` gives it ``num_parallel_calls=AUTOTUNE``.

Usage: keras_cached_aug.py FOLDER [--epochs 3] [--cache-first | --no-cache [--parallel]]
    [--check]
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras
import numpy as np
import tensorflow as tf
from keras import layers

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--cache-first", action="store_true")
parser.add_argument("--check", action="store_true")
parser.add_argument("--no-cache", action="store_true")
parser.add_argument("--parallel", action="store_true")
args = parser.parse_args()

train_ds = keras.utils.image_dataset_from_directory(args.folder, image_size=(48, 48),
                                                    batch_size=None, seed=1)
augmentation_layers = [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)]


def data_augmentation(x):
    for layer in augmentation_layers:
        x = layer(x)
    return x


if args.cache_first:
    train_ds = (train_ds.cache()
                .map(lambda x, y: (data_augmentation(x), y), num_parallel_calls=tf.data.AUTOTUNE)
                .batch(32).prefetch(tf.data.AUTOTUNE))
else:
    train_ds = train_ds.map(lambda x, y: (data_augmentation(x), y),
                            num_parallel_calls=tf.data.AUTOTUNE if args.parallel else None)
    train_ds = train_ds.batch(32).prefetch(tf.data.AUTOTUNE)
    if not args.no_cache:
        train_ds = train_ds.cache()

if args.check:
    first = [x.numpy() for x, _ in train_ds]
    second = [x.numpy() for x, _ in train_ds]
    print(f"replayed: {bool(np.array_equal(first[0], second[0]))}")
    raise SystemExit(0)

base_model = keras.Sequential([keras.Input(shape=(48, 48, 3)),
                               layers.Conv2D(16, 3, activation="relu"),
                               layers.BatchNormalization(),
                               layers.Conv2D(16, 3, activation="relu")], name="base")
base_model.trainable = False
inputs = keras.Input(shape=(48, 48, 3))
x = layers.Rescaling(scale=1 / 127.5, offset=-1)(inputs)
x = base_model(x, training=False)
x = layers.GlobalAveragePooling2D()(x)
x = layers.Dropout(0.2)(x)
outputs = layers.Dense(1)(x)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(),
              loss=keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=[keras.metrics.BinaryAccuracy()])
model.fit(train_ds, epochs=args.epochs, verbose=2)
