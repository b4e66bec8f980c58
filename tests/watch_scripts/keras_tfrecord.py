"""The tf.data performance guide's input on Keras 3 / TensorFlow: TFRecord shards of JPEG bytes,
interleaved, parsed and decoded in a parallel map, batched and prefetched, feeding a small CNN.

    python keras_tfrecord.py make IMAGES_DIR OUT    # the shards, from a folder of JPEGs
    python keras_tfrecord.py train OUT [--epochs E] [--cache]

--cache: ``.cache()`` right after the decode map, as the guide places it (the fix stepscope
advises where a map decodes the same files every epoch).
"""

from __future__ import annotations

import argparse
import glob
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # KERAS_BACKEND=jax runs it on JAX
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("mode", choices=("make", "train"))
p.add_argument("paths", nargs="+")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--cache", action="store_true")
args = p.parse_args()

if args.mode == "make":
    src, out = args.paths
    os.makedirs(out, exist_ok=True)
    names = sorted(glob.glob(os.path.join(src, "*.jpg")))
    for shard in range(4):
        with tf.io.TFRecordWriter(os.path.join(out, f"train-{shard:02d}.tfrecord")) as w:
            for name in names[shard::4]:
                label = int("dog" in os.path.basename(name))
                with open(name, "rb") as f:
                    image = f.read()
                w.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                })).SerializeToString())
    raise SystemExit(0)

import keras  # noqa: E402

SPEC = {"image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(record):  # type: ignore[no-untyped-def]
    ex = tf.io.parse_single_example(record, SPEC)
    image = tf.image.resize(tf.io.decode_jpeg(ex["image"], channels=3), (96, 96)) / 255.0
    return image, ex["label"]


files = tf.data.Dataset.list_files(os.path.join(args.paths[0], "train-*.tfrecord"), shuffle=True)
ds = files.interleave(tf.data.TFRecordDataset, cycle_length=4,
                      num_parallel_calls=tf.data.AUTOTUNE)
ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
if args.cache:
    ds = ds.cache()
ds = ds.batch(32).prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([
    keras.Input((96, 96, 3)), keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
    keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(ds, epochs=args.epochs, verbose=2)
