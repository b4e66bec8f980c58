"""Where in a Keras/TensorFlow train-function call do ``stepscope watch``'s graph clocks add
time? TensorFlow's own profiler, read call by call.

Whole runs (``bench/watch_keras_ablation.py``) and single calls timed from Python
(``bench/watch_keras_clock_ab.py --interleave step``) see a call's total, where two copies of
one model read ±70-180 us apart at random (memory layout, thread placement), more than the
clocks cost. The clocks' ops sit at the two ends of a call, though: one before the fetch and
after it, two after the step's work. So this bench reads the call's timeline from TensorFlow's
profiler (``tf.profiler.experimental``, host tracer) and times the two ends apart from the
middle (the model's own work, where the copies' noise is):

- ``start``: from the graph's start (``KernelAndDeviceFunc::Run``) to the batch fetched
  (``IteratorGetNextOp::DoCompute`` ends) and on to the first convolution's start;
- ``end``: from Keras's last op (``OptionalFromValue``, the step's logs) to the executor's done
  callback, and on to the run's end;
- ``tasks``: how many tasks the executor ran for the call (``ExecutorState::Process``). A node made
  ready by an asynchronous op (the fetch), or beside another ready node while TensorFlow's
  cost model still deems it expensive (a decayed average of its cycles over 8,000), is handed
  to the inter-op pool as a task of its own instead of run inline.

Three copies of the bench CNN (``bench/keras_cnn.py``, tf.data input): ``bare`` and ``bare2``
traced before watch's hooks (the second is the control: how far two identical copies read
apart), ``clocked`` after ``patch_backend`` as ``stepscope watch`` installs it. Their calls
alternate in a rotating order under the profiler; each figure is the median over calls, less
``bare``'s.

Usage:
    PYTHONPATH=src .venv/bin/python bench/watch_keras_call_timeline.py [--calls 150]
        [--image-px 32]

The last line is one JSON object: every copy's figures less ``bare``'s, in microseconds (tasks:
a count, the mean over calls).
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import statistics
import tempfile
from typing import Any

import keras_cnn  # bench/keras_cnn.py: bench/ is this script's folder, first on sys.path

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

Event = tuple[str, str, float, float]  # thread, name, start and duration in us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=150, help="profiled calls of each copy")
    ap.add_argument("--image-px", type=int, default=32,
                    help="the CNN's image side (64: ~9 ms steps, 32: ~4 ms)")
    args = ap.parse_args()

    import keras
    import numpy as np
    import tensorflow as tf

    from stepscope.observe.inject import stepscope_watch_keras_backends as backends
    from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps
    from stepscope.observe.inject.stepscope_watch_recorder import Channel, Recorder, count_images

    x, y = keras_cnn.arrays(np, 150 * keras_cnn.BATCH, args.image_px)

    def copy() -> Any:
        m = keras_cnn.model(keras, args.image_px)
        m.fit(keras_cnn.batches("tfdata", x, y), epochs=1, verbose=0)  # traced now
        return m

    copies = {"bare": copy(), "bare2": copy()}
    rec = Recorder(Channel(os.open(os.devnull, os.O_WRONLY)))
    steps = KerasSteps(rec, count_images)
    backends.patch_backend("tensorflow", rec, steps)
    copies["clocked"] = copy()
    its = {k: iter(keras_cnn.batches("tfdata", x, y).repeat()) for k in copies}
    for _ in range(50):  # warm
        for k, m in copies.items():
            m.train_function(its[k])
    names = list(copies)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(
            logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
        for r in range(args.calls):
            for k in names[r % 3:] + names[:r % 3]:
                with tf.profiler.experimental.Trace(f"CALL_{k}"):
                    copies[k].train_function(its[k])
            if steps.graph_clock is not None:
                steps.graph_clock.poll(pending=0)  # as watch reads it, when due
        tf.profiler.experimental.stop()
        events = _events(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")[0])
    figures = _figures(events)
    bare = figures["bare"]
    less = {k: {m: round(_center(m, v) - _center(m, bare[m]), 2)
                for m, v in f.items()} for k, f in figures.items() if k != "bare"}
    for m in bare:
        print(f"{m:22s} bare {_center(m, bare[m]):8.1f}; "
              + ", ".join(f"{k} {less[k][m]:+.1f}" for k in less))
    print(json.dumps({"figure": "watch_keras_call_timeline_us", "calls": args.calls,
                      "image_px": args.image_px,
                      "bare_us": {m: round(_center(m, v), 2) for m, v in bare.items()},
                      "less_bare_us": less}))


def _center(metric: str, values: list[float]) -> float:
    """Times: the median call. Task counts, a few integers: their mean, which can tell 0.5."""
    return statistics.mean(values) if metric.startswith("tasks") else statistics.median(values)


def _events(path: str) -> list[Event]:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    out: list[Event] = []
    for plane in space.planes:
        if "host" not in plane.name.lower():
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            for e in line.events:
                name = names.get(e.metadata_id, "?")
                if name.startswith(("ThreadpoolListener", "Memory")):
                    continue
                out.append((line.name, name, line.timestamp_ns / 1e3 + e.offset_ps / 1e6,
                            e.duration_ps / 1e6))
    return sorted(out, key=lambda e: e[2])


def _figures(events: list[Event]) -> dict[str, dict[str, list[float]]]:
    """Per copy, per call: the call, the graph's run, and the spans at its two ends (us)."""
    calls = [(e[2], e[2] + e[3], e[1][len("CALL_"):]) for e in events
             if e[1].startswith("CALL_")]
    rest = [e for e in events if not e[1].startswith("CALL_")]
    starts = [e[2] for e in rest]
    out: dict[str, dict[str, list[float]]] = {}
    for t0, t1, k in calls:
        w = rest[bisect.bisect_left(starts, t0):bisect.bisect_right(starts, t1)]

        def first(pred: Any, w: list[Event] = w) -> Event | None:
            return next((e for e in w if pred(e[1])), None)

        run = first(lambda n: n == "KernelAndDeviceFunc::Run")
        fetch = first(lambda n: n == "IteratorGetNextOp::DoCompute")
        conv = first(lambda n: "conv2d" in n and "Conv2D" in n and "gradient" not in n)
        logs = first(lambda n: "OptionalFromValue" in n)
        done = first(lambda n: n == "ExecutorDoneCallback")
        if run is None or fetch is None or conv is None or logs is None or done is None:
            continue  # a call the profiler caught in part
        f = out.setdefault(k, {})
        # The executor's tasks (``Process``: a ready node handed to the inter-op pool, which may
        # wake a parked worker): a clock op dispatched on its own instead of run inline by the
        # thread that made it ready adds one
        f.setdefault("tasks (count)", []).append(sum(1 for e in w if e[1].endswith("::Process")))
        for m, v in (("call", t1 - t0), ("run", run[3]),
                     ("start: to the fetch", fetch[2] + fetch[3] - run[2]),
                     ("start: fetch to conv", conv[2] - fetch[2] - fetch[3]),
                     ("middle: conv to logs", logs[2] - conv[2]),
                     ("end: logs to done", done[2] + done[3] - logs[2]),
                     ("end: done to run end", run[2] + run[3] - done[2] - done[3])):
            f.setdefault(m, []).append(v)
    return out


if __name__ == "__main__":
    main()
