"""What does ``stepscope watch`` cost a Keras script? Throughput watched / bare.

Runs one small Keras 3 script on the TensorFlow backend (or ``--backend jax|torch``; a small CNN on 32x32 images fed by a
``keras.utils.PyDataset``, or with ``--input tfdata`` by a ``tf.data`` pipeline over in-memory
arrays; Adam, a validation pass per epoch) bare and under
:func:`stepscope.observe.watch.watch`, alternating so machine noise hits both alike. The script
times its own epochs with an epoch-level callback (no batch hooks, the same in both runs) and
reports its best training epoch after the first (which traces the train function), so process
start-up, imports and tracing are not counted: only what watching adds while training runs —
the watch callback, the graph clock (ops traced around each fetch and after each step's
work, copied into a ring the loop reads every ``POLL_S``, 0.5 s), the timed graph calls, the parent's samplers; on JAX the timed
``next()`` and the one step kept in flight (the loop waits for step k-1 after dispatching k). It also reports the training
process's CPU time per image, watched / bare, and on TensorFlow each epoch's time a step in the
graph calls (the script wraps ``Context.call_function`` itself, in both runs alike: watch's own timer of that kind measured 2-10 us a call)
and the step's wall time. On a quiet machine the pairs agree within a few
per cent; on a loaded one a pair swings by ±20 %, and ``watch_keras_step_cost.py`` measures the
cost directly.

Usage:
    .venv/bin/python bench/watch_keras_overhead.py [--runs 5] [--steps 150] [--interval 1.0]
        [--input pydataset|tfdata] [--backend tensorflow|jax|torch] [--control] [--epochs 4]

The last line is the headline figure as one JSON object (median of the per-pair ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import keras_cnn  # bench/keras_cnn.py: bench/ is this script's folder, first on sys.path
from stepscope.observe.watch import watch

SCRIPT = '''
import json, os, sys, time
os.environ["KERAS_BACKEND"] = sys.argv[4]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np

import keras_cnn  # bench/keras_cnn.py, copied beside this script (write_script)

out, steps, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
graph = [0.0]  # the loop's seconds in TensorFlow's graph calls (watch's call timer inside them)
if sys.argv[4] == "tensorflow":
    import threading
    from tensorflow.python.eager import context

    inner, loop = context.Context.call_function, threading.get_ident()

    def call_function(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            if threading.get_ident() == loop:
                graph[0] += time.perf_counter() - t0

    context.Context.call_function = call_function
epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 4
px = int(sys.argv[6]) if len(sys.argv) > 6 else 32  # image side: the step's compute grows as px**2
images = steps * keras_cnn.BATCH  # an epoch's
x_all, y_all = keras_cnn.arrays(np, images, px)


class EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates, self.cpu, self.graph_us, self.step_us = [], [], [], []
        self.loop_us = []  # the loop thread's own CPU a step (Keras calls callbacks on it)

    def on_epoch_begin(self, epoch, logs=None):
        self.t0, self.c0, self.g0 = time.perf_counter(), time.process_time(), graph[0]
        self.l0 = time.thread_time()

    def on_test_begin(self, logs=None):  # the training part of the epoch ends here
        if self.t0 is not None:
            self.rates.append(images / (time.perf_counter() - self.t0))
            self.step_us.append((time.perf_counter() - self.t0) / steps * 1e6)
            self.graph_us.append((graph[0] - self.g0) / steps * 1e6)
            self.cpu.append((time.process_time() - self.c0) / images)
            self.loop_us.append((time.thread_time() - self.l0) / steps * 1e6)
            self.t0 = None


def batches(n):
    return keras_cnn.batches(kind, x_all[:n], y_all[:n])


model = keras_cnn.model(keras, px)
clock = EpochClock()
model.fit(batches(images), validation_data=batches(256), epochs=epochs, verbose=0,
          callbacks=[clock])
with open(out, "w") as f:
    # The best epoch after the first: other load on a shared machine only ever slows an epoch
    # down, while watching's own costs hit every epoch alike.
    json.dump({"images_per_s": max(clock.rates[1:]), "cpu_s_per_image": min(clock.cpu[1:]),
               "loop_cpu_us_per_step": min(clock.loop_us[1:]),
               "epochs_img_s": clock.rates[1:], "epochs_step_us": clock.step_us[1:],
               "epochs_graph_us": clock.graph_us[1:]}, f)
'''


def write_script(folder: Path, name: str = "keras_small.py") -> Path:
    """``SCRIPT`` as a program in ``folder``, with the module it imports beside it."""
    script = folder / name
    script.write_text(SCRIPT)
    keras_cnn.copy_beside(script)
    return script


# watch's parent from another source tree (``_run``'s ``tree``), as this process is for the others
TREE_PARENT = ("import sys\nfrom pathlib import Path\nfrom stepscope.observe.watch import watch\n"
               "sys.exit(watch(sys.argv[3:], Path(sys.argv[1]), "
               "interval_s=float(sys.argv[2])).exit_code)")


def _run(script: Path, work: Path, index: int, watched: bool, steps: int, interval_s: float,
         kind: str = "pydataset", backend: str = "tensorflow",
         epochs: int = 4, px: int = 32, tree: str | None = None) -> dict[str, Any]:
    """One run's best epoch after the first (``images_per_s``, ``cpu_s_per_image``) and every
    epoch after the first (``epochs_img_s``; on TensorFlow also ``epochs_step_us`` and
    ``epochs_graph_us``, each step's wall time and its graph calls', per step). ``tree``: a
    watched run is watched by that source tree's stepscope, its parent a process of its own."""
    out = work / f"result-{index}-{int(watched)}.json"
    cmd = [sys.executable, str(script), str(out), str(steps), kind, backend, str(epochs), str(px)]
    if watched and tree is not None:
        done = subprocess.run([sys.executable, "-c", TREE_PARENT, str(work / f"run-{index}"),
                               str(interval_s), *cmd],
                              env={**os.environ, "PYTHONPATH": tree}, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the run watched from {tree} failed with exit code "
                             f"{done.returncode}")
    elif watched:
        result = watch(cmd, work / f"run-{index}", interval_s=interval_s)
        if result.exit_code != 0:
            raise SystemExit(f"watched run failed with exit code {result.exit_code}")
    else:
        # In its own session like the watched child (see bench/watch_overhead.py: autogroup).
        subprocess.run(cmd, check=True, start_new_session=True,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (>= 3)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling period (s)")
    parser.add_argument("--input", choices=("pydataset", "tfdata"), default="pydataset",
                        help="the input: a PyDataset (a Python generator inside tf.data) or a "
                             "tf.data pipeline over in-memory arrays")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="tensorflow",
                        help="KERAS_BACKEND of the script")
    parser.add_argument("--control", action="store_true",
                        help="calibrate: the 'watched' run of each pair runs bare too, so the "
                             "ratio is how far two bare runs read apart on this host now")
    parser.add_argument("--epochs", type=int, default=4,
                        help="epochs per run; the best after the first is compared")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch traces and is not compared")
    if args.input == "tfdata" and args.backend != "tensorflow":
        parser.error("--input tfdata runs on --backend tensorflow only")
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    loads: list[float] = []  # 1-minute load average at each pair's start and end
    with tempfile.TemporaryDirectory(prefix="stepscope-watch-keras-bench-") as tmp:
        work = Path(tmp)
        script = write_script(work)
        for i in range(max(args.runs, 3)):
            # Alternate which goes first so a drift in machine load favours neither.
            order = (False, True) if i % 2 == 0 else (True, False)
            loads.append(os.getloadavg()[0])
            rates = {w: _run(script, work, i, w and not args.control, args.steps,
                             args.interval, args.input, args.backend, args.epochs)
                     for w in order}
            loads.append(os.getloadavg()[0])
            bare, watched = rates[False], rates[True]
            ratios.append(watched["images_per_s"] / bare["images_per_s"])
            cpu_ratios.append(watched["cpu_s_per_image"] / bare["cpu_s_per_image"])
            print(f"pair {i}: bare {bare['images_per_s']:.0f} img/s, watched "
                  f"{watched['images_per_s']:.0f} img/s, ratio {ratios[-1]:.4f}; "
                  f"training-process CPU per image watched/bare {cpu_ratios[-1]:.4f}; "
                  f"load {loads[-2]:.1f}-{loads[-1]:.1f}",
                  file=sys.stderr, flush=True)
    print(f"watched/bare throughput: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}) over {len(ratios)} pairs; "
          f"training-process CPU per image watched/bare: median "
          f"{statistics.median(cpu_ratios):.4f}; load average {min(loads):.1f}-{max(loads):.1f}")
    print(json.dumps({"figure": "watch_keras_overhead_ratio" + ("_control" * args.control),
                      "input": args.input,
                      "backend": args.backend,
                      "value": round(statistics.median(ratios), 4),
                      "min": round(min(ratios), 4), "max": round(max(ratios), 4),
                      "runs": len(ratios),
                      "cpu_per_image_ratio": round(statistics.median(cpu_ratios), 4),
                      "load_min": round(min(loads), 1), "load_max": round(max(loads), 1)}))


if __name__ == "__main__":
    main()
