"""A Keras script with a planted cost, written the way the Keras docs write it.

    python keras_known.py BACKEND INPUT LOAD_MS MODEL [--workers N] [--mp] [--legacy]
        [--steps S] [--epochs E] [--val S] [--callback-ms MS] [--tensorboard DIR] [--spe N]
        [--mirrored]
        [--cpu-clock] [--gap-clock] [--own-train-function] [--val-input KIND] [--val-load-ms MS]
        [--policy NAME] [--cache] [--initial-epoch N] [--refit] [--augment-layers] [--jit]

BACKEND: tensorflow | jax | torch (KERAS_BACKEND); --legacy runs tf-keras (TF_USE_LEGACY_KERAS=1,
``import tensorflow as tf; tf.keras``). INPUT: pydataset | generator | tfdata | tfdata-parallel |
arrays | dataloader (torch backend: a torch ``DataLoader``, which Keras 3 takes as it is; its
``num_workers`` is 0, or --workers where that is over 1). LOAD_MS: CPU burnt per batch by the loader (a busy loop, like decoding and augmenting).
MODEL: dense (tiny, ~1 ms a step) | conv (convolutions on 32x32 images, ~15 ms a step here).
--callback-ms: a user callback sleeping MS in ``on_train_batch_end`` (per-batch logging to a slow
sink), not async-safe, so Keras runs it on the loop's thread between steps.
--tensorboard DIR: ``keras.callbacks.TensorBoard(log_dir=DIR, update_freq="batch")``, the
callback writing every batch's logs (its hooks are not async-safe: Keras runs them on the loop).
--spe: ``model.compile(steps_per_execution=N)`` (the fix stepscope advises for slow callbacks).
--jit: ``model.compile(jit_compile=True)``: XLA, what Keras 3's default ``"auto"`` picks on a GPU.
--mirrored: model built and compiled under ``tf.distribute.MirroredStrategy(["/cpu:0"])``.
--val-input, --val-load-ms: the validation input's kind and planted cost, where they differ
from training's (a tf.data training pipeline validated on a PyDataset, as scripts mix them).
--policy: ``keras.mixed_precision.set_global_policy(NAME)`` before the model is built
(``mixed_bfloat16``: the mixed precision stepscope advises on a CPU with native bf16).
--cache (tf.data inputs): ``.cache()`` after the maps, as the tf.data guide places it, so only
epoch 1 runs the planted cost and later epochs read the cached batches.
--initial-epoch: ``fit(initial_epoch=N)``, a run resumed after N epochs (Keras prints
"Epoch N+1/E" first).
--refit: after the first ``fit``, ``compile`` again (with a lower learning rate) and ``fit``
again, as the Keras fine-tuning guide does after unfreezing its base: the second fit traces a
new train function in its first step.
--augment-layers (conv): the transfer-learning guide's augmentation inside the model, a
``Sequential`` of ``RandomFlip`` and ``RandomRotation`` after the input (Keras runs it in training
steps only).
--own-train-function (Keras 3 on TensorFlow): the model makes its own train function, a
``tf.function`` that takes the next batch and runs ``train_step``, overriding
``make_train_function`` as a custom training loop written before Keras 3 did.
--cpu-clock: LOAD_MS is the loading thread's CPU time (``time.thread_time``), a fixed amount of
pure-Python work that holds the GIL: PyDataset worker threads then take turns, as real ones do.
--workers/--mp with --legacy go to ``fit(workers=, use_multiprocessing=)``, as tf-keras takes them.
--gap-clock (torch backend only): a callback of the script's own times each step from
``on_train_batch_begin`` to ``on_train_batch_end`` and the gap from one step's end to the next
one's begin, and prints ``GAP epoch=E wait=F`` (the gaps' share of the epoch's steady steps).
On torch Keras's loop is Python and takes each batch from its iterator in that gap, so this is a
second, independent measure of the data wait, taken without stepscope.
The first line printed is the truth the test asserts against: ``TRUTH load_ms=... model=...``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("backend")
p.add_argument("input")
p.add_argument("load_ms", type=float)
p.add_argument("model")
p.add_argument("--workers", type=int, default=1)
p.add_argument("--mp", action="store_true")
p.add_argument("--legacy", action="store_true")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--val", type=int, default=0)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--callback-ms", type=float, default=0.0)
p.add_argument("--spe", type=int, default=1)
p.add_argument("--tensorboard", default=None)
p.add_argument("--mirrored", action="store_true")
p.add_argument("--cpu-clock", action="store_true")
p.add_argument("--gap-clock", action="store_true")
p.add_argument("--own-train-function", action="store_true")
p.add_argument("--val-input", default=None)
p.add_argument("--val-load-ms", type=float, default=None)
p.add_argument("--policy", default=None)
p.add_argument("--cache", action="store_true")
p.add_argument("--initial-epoch", type=int, default=0)
p.add_argument("--refit", action="store_true")
p.add_argument("--augment-layers", action="store_true")
p.add_argument("--jit", action="store_true")
args = p.parse_args()

os.environ["KERAS_BACKEND"] = args.backend
if args.legacy:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

if args.legacy:
    import tensorflow as tf

    keras = tf.keras
    Base = keras.utils.Sequence
else:
    import keras

    Base = keras.utils.PyDataset

SIDE = 32 if args.model == "conv" else 16
SHAPE = (SIDE, SIDE, 3) if args.model == "conv" else (SIDE,)
VAL_INPUT = args.val_input or args.input
VAL_LOAD_MS = args.load_ms if args.val_load_ms is None else args.val_load_ms
print(f"TRUTH load_ms={args.load_ms} model={args.model} input={args.input} "
      f"val_input={VAL_INPUT} val_load_ms={VAL_LOAD_MS}", flush=True)


# --cpu-clock: the cost is CPU time of the loading thread (a fixed amount of Python work), so
# threads that take turns holding the GIL each take longer by the wall clock; by default it is
# wall time (a loader that got less CPU still finishes on time).
CLOCK = time.thread_time if args.cpu_clock else time.perf_counter


def burn(ms: float) -> None:
    """Busy CPU for ``ms`` milliseconds: the loader's decode and augmentation."""
    end = CLOCK() + ms / 1000.0
    x = 0
    while CLOCK() < end:
        x += 1


def make_batch(i: int, load_ms: float) -> tuple[np.ndarray, np.ndarray]:
    burn(load_ms)
    rng = np.random.default_rng(i)
    x = rng.normal(size=(args.batch, *SHAPE)).astype("float32")
    y = rng.integers(0, 2, size=(args.batch,)).astype("float32")
    return x, y


class Batches(Base):  # type: ignore[misc,valid-type]
    def __init__(self, n: int, load_ms: float) -> None:
        if args.legacy:
            super().__init__()
        else:
            super().__init__(workers=args.workers, use_multiprocessing=args.mp)
        self.n, self.load_ms = n, load_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return make_batch(i, self.load_ms)


def generator(n: int, load_ms: float):  # type: ignore[no-untyped-def]
    while True:
        for i in range(n):
            yield make_batch(i, load_ms)


def tf_data(n: int, parallel: bool, load_ms: float):  # type: ignore[no-untyped-def]
    import tensorflow as tf

    def load(i):  # type: ignore[no-untyped-def]
        return make_batch(int(i), load_ms)

    ds = tf.data.Dataset.range(n).map(
        lambda i: tf.numpy_function(load, [i], (tf.float32, tf.float32)),
        num_parallel_calls=tf.data.AUTOTUNE if parallel else None)
    ds = ds.map(lambda x, y: (tf.ensure_shape(x, (args.batch, *SHAPE)),
                              tf.ensure_shape(y, (args.batch,))))
    if args.cache:
        ds = ds.cache()
    return ds.prefetch(tf.data.AUTOTUNE) if parallel else ds


def source(n: int, kind: str, load_ms: float):  # type: ignore[no-untyped-def]
    if kind == "pydataset":
        return Batches(n, load_ms)
    if kind == "generator":
        return generator(n, load_ms)
    if kind.startswith("tfdata"):
        return tf_data(n, kind == "tfdata-parallel", load_ms)
    if kind == "dataloader":
        import torch

        class TorchBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return n

            def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
                return make_batch(i, load_ms)

        return torch.utils.data.DataLoader(TorchBatches(), batch_size=None,
                                           num_workers=args.workers if args.workers > 1 else 0)
    xs, ys = zip(*(make_batch(i, load_ms) for i in range(n)), strict=True)
    return np.concatenate(xs), np.concatenate(ys)


if args.own_train_function:
    import tensorflow as tf

    class OwnTrainFunction(keras.Sequential):  # type: ignore[misc,name-defined]
        def make_train_function(self, force=False):  # type: ignore[no-untyped-def]
            if self.train_function is not None and not force:
                return self.train_function

            @tf.function
            def train_function(iterator):  # type: ignore[no-untyped-def]
                return self.train_step(next(iterator))

            self.train_function = train_function
            return train_function


def build():  # type: ignore[no-untyped-def]
    if args.policy:
        keras.mixed_precision.set_global_policy(args.policy)
    if args.model == "conv":
        augment = [keras.Sequential([keras.layers.RandomFlip("horizontal"),
                                     keras.layers.RandomRotation(0.1)])] \
            if args.augment_layers else []
        layers = [keras.Input(shape=SHAPE), *augment,
                  keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                  keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                  keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                  keras.layers.GlobalAveragePooling2D(),
                  keras.layers.Dense(1, activation="sigmoid")]
    else:
        layers = [keras.Input(shape=SHAPE), keras.layers.Dense(16, activation="relu"),
                  keras.layers.Dense(1, activation="sigmoid")]
    model = (OwnTrainFunction if args.own_train_function else keras.Sequential)(layers)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                  steps_per_execution=args.spe, **({"jit_compile": True} if args.jit else {}))
    return model


if args.mirrored:
    import tensorflow as tf

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = build()
else:
    model = build()

train = source(args.steps, args.input, args.load_ms)
kw: dict = {"epochs": args.epochs, "verbose": 2, "initial_epoch": args.initial_epoch}
if args.input == "arrays":
    x, y = train
    kw.update(x=x, y=y, batch_size=args.batch)
else:
    kw["x"] = train
if args.input == "generator":
    kw["steps_per_epoch"] = args.steps
if args.legacy and args.input == "pydataset" and (args.workers > 1 or args.mp):
    # tf-keras takes a Sequence's parallelism from fit(), not from the Sequence.
    kw.update(workers=args.workers, use_multiprocessing=args.mp)
if args.val:
    val = source(args.val, VAL_INPUT, VAL_LOAD_MS)
    kw["validation_data"] = val
    if VAL_INPUT == "generator":
        kw["validation_steps"] = args.val
if args.callback_ms:
    class SlowLog(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            time.sleep(args.callback_ms / 1000.0)

    kw["callbacks"] = [SlowLog()]
if args.tensorboard:
    kw.setdefault("callbacks", []).append(
        keras.callbacks.TensorBoard(log_dir=args.tensorboard, update_freq="batch"))
if args.gap_clock:
    class GapClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.marks: list[tuple[float, float]] = []
            self.last_end = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):  # type: ignore[no-untyped-def]
            self.begin = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            end = time.perf_counter()
            self.marks.append((self.begin - self.last_end, end - self.begin))
            self.last_end = end

        def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            steady = self.marks[1:]  # the first waits for the pool to start
            gap, step = sum(g for g, _ in steady), sum(s for _, s in steady)
            print(f"GAP epoch={epoch + 1} wait={gap / (gap + step):.3f} "
                  f"step_ms={1000 * step / len(steady):.1f}", flush=True)

    kw.setdefault("callbacks", []).append(GapClock())
model.fit(**kw)
if args.refit:
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="binary_crossentropy",
                  metrics=["accuracy"], steps_per_execution=args.spe)
    model.fit(**kw)
print("DONE", file=sys.stderr)
