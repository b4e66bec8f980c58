"""The small CNN the Keras watch benches train, and its input, in one place.

Two convolutions over random 32-row batches of ``px``-pixel images (~4 ms a step at 32 px on
this 2-core host, ~9 ms at 64 px): a step short enough that a fixed cost per step shows. The
input is a ``keras.utils.PyDataset`` over in-memory arrays, or the tf.data guide's pipeline over
them (``from_tensor_slices``, ``batch``, ``prefetch(AUTOTUNE)``).

``bench/watch_keras_overhead.py`` runs it as a program of its own (``write_script`` copies this
file beside it); ``bench/watch_keras_clock_ab.py`` imports it. Frameworks are passed in, so
importing this module imports none.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

BATCH = 32


def arrays(np: Any, images: int, px: int = 32) -> tuple[Any, Any]:
    """``images`` random float32 images and their labels (10 classes), seeded."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(images, px, px, 3)).astype("float32")
    return x, rng.integers(0, 10, size=(images,))


def batches(kind: str, x: Any, y: Any) -> Any:
    """The first ``len(x)`` images as a ``pydataset`` or a ``tfdata`` pipeline."""
    if kind == "pydataset":
        import keras

        class Batches(keras.utils.PyDataset):  # type: ignore[misc]
            def __len__(self) -> int:
                return len(x) // BATCH

            def __getitem__(self, i: int) -> Any:
                sl = slice(i * BATCH, (i + 1) * BATCH)
                return x[sl], y[sl]

        return Batches()
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def model(keras: Any, px: int = 32) -> Any:
    """The CNN, compiled (Adam, sparse categorical cross-entropy)."""
    m = keras.Sequential([
        keras.Input(shape=(px, px, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
    m.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return m


def copy_beside(script: Path) -> None:
    """Put this module beside ``script``, a program that imports it."""
    shutil.copyfile(Path(__file__), script.parent / "keras_cnn.py")
