"""A training loop written from scratch, as the Keras guide writes it for TensorFlow
("Writing a training loop from scratch"): a ``tf.data`` dataset iterated in Python, a
``tf.function`` train step with ``tf.GradientTape`` and ``apply_gradients``, a validation loop
after each epoch. No ``fit``, so no Keras callbacks.

    python tf_loop.py LOAD_MS MODEL [--steps S] [--val S] [--epochs E] [--eager]
                      [--iterator-in K]

LOAD_MS: CPU burnt per batch by the loader (a busy loop in a ``numpy_function`` map, like
decoding and augmenting; one call at a time, no prefetch). MODEL: dense (tiny) | conv
(convolutions on 32x32 images). --eager: no ``tf.function`` (the guide's first version): the
gradients and the validation forward run eagerly. --iterator-in K: the iterator is passed into
the ``tf.function``, which takes K batches with ``next(iterator)`` in a ``tf.range`` loop (TensorFlow's
custom-training guides, ``train_step(iterator)``); a new ``iter(dataset)`` each epoch.
--parallel: the loader's map with ``num_parallel_calls=AUTOTUNE`` and a prefetch (the fix
stepscope advises). --cpu-clock: LOAD_MS is the loading thread's CPU time (``time.thread_time``),
a fixed amount of pure-Python work that holds the GIL, as real per-item Python does (the default
busy-waits on the wall clock, which two threads sharing the GIL both finish on time).
--gil-free: that CPU time is spent hashing 256 kB buffers (``hashlib`` releases the GIL), as
NumPy, OpenCV and PIL's decoders do. --val-gil-free: the validation loader hashes while the
training loader runs Python (with --cpu-clock): one process, two answers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("load_ms", type=float)
p.add_argument("model")
p.add_argument("--steps", type=int, default=24)
p.add_argument("--val", type=int, default=6)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--eager", action="store_true")
p.add_argument("--iterator-in", type=int, default=0)
p.add_argument("--parallel", action="store_true")
p.add_argument("--cpu-clock", action="store_true")
p.add_argument("--gil-free", action="store_true")
p.add_argument("--val-gil-free", action="store_true")
args = p.parse_args()
SHAPE = (32, 32, 3) if args.model == "conv" else (16,)
print(f"TRUTH load_ms={args.load_ms} model={args.model} eager={args.eager} "
      f"iterator_in={args.iterator_in}", flush=True)


BUF = os.urandom(1 << 18)


def load(i, gil_free=args.gil_free):  # type: ignore[no-untyped-def]
    clock = time.thread_time if args.cpu_clock or gil_free else time.perf_counter
    end = clock() + args.load_ms / 1000.0
    while clock() < end:
        if gil_free:
            hashlib.sha256(BUF).digest()
    rng = np.random.default_rng(int(i))
    return (rng.normal(size=(args.batch, *SHAPE)).astype("float32"),
            rng.integers(0, 2, size=(args.batch, 1)).astype("float32"))


def dataset(n: int, gil_free: bool = args.gil_free) -> tf.data.Dataset:
    if args.load_ms <= 0:  # instant batches, held in memory and prefetched
        x, y = load(0)
        return tf.data.Dataset.from_tensors((x, y)).repeat(n).prefetch(tf.data.AUTOTUNE)
    parallel = tf.data.AUTOTUNE if args.parallel else None
    ds = tf.data.Dataset.range(n).map(
        lambda i: tf.numpy_function(lambda j: load(j, gil_free), [i], (tf.float32, tf.float32)),
        num_parallel_calls=parallel)
    ds = ds.map(lambda x, y: (tf.ensure_shape(x, (args.batch, *SHAPE)),
                              tf.ensure_shape(y, (args.batch, 1))))
    return ds.prefetch(tf.data.AUTOTUNE) if args.parallel else ds


train_dataset = dataset(args.steps)
val_dataset = dataset(args.val, args.gil_free or args.val_gil_free)
if args.model == "conv":
    layers = [keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
              keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
              keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
              keras.layers.GlobalAveragePooling2D()]
else:
    layers = [keras.layers.Dense(16, activation="relu")]
model = keras.Sequential([keras.Input(SHAPE), *layers, keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
val_acc_metric = keras.metrics.BinaryAccuracy()


def train_step(x, y):  # type: ignore[no-untyped-def]
    with tf.GradientTape() as tape:
        loss_value = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply_gradients(zip(grads, model.trainable_weights, strict=True))
    return loss_value


def test_step(x, y):  # type: ignore[no-untyped-def]
    val_acc_metric.update_state(y, model(x, training=False))


if args.iterator_in:
    k = args.iterator_in

    @tf.function
    def train_steps(iterator):  # type: ignore[no-untyped-def]
        loss_value = tf.constant(0.0)
        for _ in tf.range(k):
            x, y = next(iterator)
            loss_value = train_step(x, y)
        return loss_value

    @tf.function
    def test_steps(iterator):  # type: ignore[no-untyped-def]
        for _ in tf.range(k):
            x, y = next(iterator)
            test_step(x, y)

    for epoch in range(args.epochs):
        print(f"Start of epoch {epoch}", flush=True)
        train_iterator = iter(train_dataset)
        for _ in range(args.steps // k):
            loss_value = train_steps(train_iterator)
        val_iterator = iter(val_dataset)
        for _ in range(args.val // k):
            test_steps(val_iterator)
        print(f"loss {float(loss_value):.4f} val_acc {float(val_acc_metric.result()):.4f}",
              flush=True)
        val_acc_metric.reset_state()
    raise SystemExit(0)

if not args.eager:
    train_step, test_step = tf.function(train_step), tf.function(test_step)

for epoch in range(args.epochs):
    print(f"Start of epoch {epoch}", flush=True)
    for x_batch_train, y_batch_train in train_dataset:
        loss_value = train_step(x_batch_train, y_batch_train)
    for x_batch_val, y_batch_val in val_dataset:
        test_step(x_batch_val, y_batch_val)
    print(f"loss {float(loss_value):.4f} val_acc {float(val_acc_metric.result()):.4f}", flush=True)
    val_acc_metric.reset_state()
