"""Which of ``stepscope watch``'s graph clocks costs a Keras/TensorFlow step its throughput?

Whole-run pairs (``bench/watch_keras_overhead.py``) compare two processes, so a host whose speed
drifts from minute to minute (other tenants) moves each pair by more than the few per cent in
question. Here one process holds three copies of the same small CNN (the overhead bench's), each
with its train function traced under a different part of watch's Keras hooks:

- ``bare``: traced before any hook is installed;
- ``fetch``: traced with the fetch clock (ops around each ``get_next``, ``GraphClock.clocked``);
- ``fetch+end``: traced with the fetch clock and the step-end clock (``GraphClock.ended``), as
  ``stepscope watch`` traces it.

Epochs of the three then alternate, in a rotating order, over the same input: the Python hooks
(the epoch iterator's, the timed graph calls) are installed for all three alike, so the
difference between copies is only what the clocks put in the graph. A round is one epoch of each;
the figure is each copy's throughput ÷ ``bare``'s in the same round, median over rounds.
Drift within a round still counts: at 60 steps an epoch (~1 s) single rounds read 0.50-1.10 on a
busy host (2026-12-03), and one run's 0.50 for ``fetch+end`` did not come back in the next two.
Use long epochs and many rounds; no figure in the docs rests on this bench yet.

Usage:
    PYTHONPATH=src .venv/bin/python bench/watch_keras_clock_ab.py [--rounds 8] [--steps 150]
        [--input pydataset|tfdata]

The last line is the headline as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    ap.add_argument("--input", choices=("pydataset", "tfdata"), default="pydataset")
    args = ap.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer
    from tensorflow.python.data.ops import iterator_ops

    from stepscope.observe.inject import stepscope_watch_keras_backends as backends
    from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps
    from stepscope.observe.inject.stepscope_watch_recorder import Channel, Recorder, count_images

    n = args.steps * 32
    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y_all = rng.integers(0, 10, size=(n,))

    class Batches(keras.utils.PyDataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return n // 32

        def __getitem__(self, i: int) -> Any:
            sl = slice(i * 32, (i + 1) * 32)
            return x_all[sl], y_all[sl]

    def data() -> Any:
        if args.input == "pydataset":
            return Batches()
        return tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(32).prefetch(
            tf.data.AUTOTUNE)

    def model() -> Any:
        m = keras.Sequential([
            keras.Input(shape=(32, 32, 3)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
        m.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return m

    def epoch(m: Any) -> float:
        t0 = time.perf_counter()
        m.fit(data(), epochs=1, verbose=0)
        return n / (time.perf_counter() - t0)

    copies: dict[str, Any] = {}
    copies["bare"] = model()
    epoch(copies["bare"])  # traced before any hook

    # watch's hooks, as the watched interpreter installs them, records to /dev/null
    originals = (iterator_ops.OwnedIterator._next_internal,
                 iterator_ops.OwnedIterator.get_next_as_optional)
    rec = Recorder(Channel(os.open(os.devnull, os.O_WRONLY)))
    backends.patch_backend("tensorflow", rec, KerasSteps(rec, count_images))
    clocked = (iterator_ops.OwnedIterator._next_internal,
               iterator_ops.OwnedIterator.get_next_as_optional)
    with_end = trainer.TensorFlowTrainer._autoconvert_optionals

    # fetch only: the step-end wrapper is taken out while this copy traces
    trainer.TensorFlowTrainer._autoconvert_optionals = _unwrapped(with_end)
    copies["fetch"] = model()
    epoch(copies["fetch"])
    trainer.TensorFlowTrainer._autoconvert_optionals = with_end
    copies["fetch+end"] = model()
    epoch(copies["fetch+end"])
    assert (iterator_ops.OwnedIterator._next_internal,
            iterator_ops.OwnedIterator.get_next_as_optional) == clocked != originals

    names = list(copies)
    rates: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]
        for k in order:
            rates[k].append(epoch(copies[k]))
        print(f"round {r}: " + ", ".join(f"{k} {rates[k][-1]:.0f} img/s" for k in names),
              flush=True)
    ratios = {k: statistics.median(a / b for a, b in zip(rates[k], rates["bare"], strict=True))
              for k in names[1:]}
    spreads = {k: [round(min(a / b for a, b in zip(rates[k], rates["bare"], strict=True)), 4),
                   round(max(a / b for a, b in zip(rates[k], rates["bare"], strict=True)), 4)]
               for k in names[1:]}
    print(f"÷ bare, median over {args.rounds} rounds: "
          + ", ".join(f"{k} {v:.4f} {spreads[k]}" for k, v in ratios.items()))
    print(json.dumps({"figure": "watch_keras_clock_ab", "input": args.input,
                      "rounds": args.rounds, "bare_img_s": round(statistics.median(rates["bare"])),
                      **{k: round(v, 4) for k, v in ratios.items()},
                      "spread": spreads}))


def _unwrapped(patched: Any) -> Any:
    """Keras's own ``_autoconvert_optionals``, from the closure of watch's wrapper of it."""
    for cell in patched.__closure__ or ():
        fn = cell.cell_contents
        if callable(fn) and getattr(fn, "__name__", "") == "_autoconvert_optionals" \
                and fn is not patched:
            return fn
    sys.exit("could not find Keras's own _autoconvert_optionals under watch's wrapper")


if __name__ == "__main__":
    main()
