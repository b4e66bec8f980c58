"""What does ``stepscope watch`` add to each Keras/TensorFlow training step? Its direct cost.

A watched Keras 3 run on TensorFlow differs from a bare one by four things, each timed here on
its own, bare and instrumented alternately in one process, so the difference is the cost:

1. the hooks on the loop's thread, per step: the watch callback's ``on_train_batch_begin``
   (which closes the last step and sends its record down a pipe, here to ``/dev/null``), the
   epoch iterator's ``use`` and the graph timer's bookkeeping (``KerasSteps``), with the clocks
   loading that runs Python in the process adds (the loop thread's off-CPU time, the loading
   threads' busy time);
2. the graph clock, per step: the ops traced around ``get_next`` and after the step's result
   in the train function (``GraphClock``) and the loop's read of their ring (``poll``, once in
   ``POLL_S`` / ``--step-ms`` steps, as watch reads it), CPU of every thread while a
   ``tf.function`` fetches 32-row batches from a prefetched ``tf.data`` pipeline, traced bare
   and traced clocked, called alternately;
3. the timed ``Context.call_function``, per train-function call: a small ``tf.function``
   called bare and through the wrapper (``time_graph_calls``);
4. the watching parent (samplers at 1 Hz, the pipe reader, the store writer), CPU per second
   while it watches the bench CNN train (in its own process: the parent imports no
   TensorFlow), over ``--parent-seconds`` from 12 s after the start (imports and tracing are
   over by then), while the CNN still trains: the steady rate a long run pays at the CNN's
   step rate (start-up, the store's set-up and the closing analysis are paid once). It reads
   and stores every step's record: a command that only sleeps, which this bench watched until
   2026-12-03, sends none, and read 3.2 ms a second where the CNN's ~90 steps a second read
   7.5-9.2.

The training process pays 1–3 per step; 4 runs beside it, and is counted here as if it took
its CPU from the training (the worst case, when the job has every core). A throughput
comparison of whole runs (``bench/watch_keras_overhead.py``) swings ±20 % per pair on this
shared machine, far more than these costs, so they are measured directly. This is a floor:
it cannot show what extra work does to the scheduling of the graph's own threads on a
machine whose cores they fill (the mark the clock replaced cost 29 us here, ~5 % whole-run).

Usage:
    .venv/bin/python bench/watch_keras_step_cost.py [--rounds 5] [--step-ms 28]

``--step-ms`` is the step whose share is reported (default: the CNN of
``bench/watch_keras_overhead.py``, timed bare here, median of 3 runs). The last line is the
headline as one JSON object: the training process's microseconds per step (median of rounds,
with min and max) and the share of that step watching costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INJECT = ROOT / "src" / "stepscope" / "observe" / "inject"

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _cpu_us_per(n: int, fn: Callable[[], None]) -> float:
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / n * 1e6


def _alternate(rounds: int, bare: Callable[[], float], ours: Callable[[], float]
               ) -> list[float]:
    """ours - bare per round, alternating which goes first."""
    out = []
    for r in range(rounds):
        if r % 2:
            b = bare()
            o = ours()
        else:
            o = ours()
            b = bare()
        out.append(o - b)
    return out


def measure_child(rounds: int, step_ms: float) -> dict[str, list[float]]:
    sys.path.insert(0, str(INJECT))
    import keras
    import numpy as np
    import stepscope_watch_keras as hooks
    import stepscope_watch_keras_calls as kcalls
    import stepscope_watch_keras_clock as kclock
    import stepscope_watch_keras_steps as ksteps
    import tensorflow as tf
    from stepscope_watch_recorder import Channel, Recorder, count_images

    rec = Recorder(Channel(os.open(os.devnull, os.O_WRONLY)))
    steps = ksteps.KerasSteps(rec, count_images)
    # With loading that runs Python in the process watch also reads the loop thread's off-CPU
    # clock and the loading's busy clock at each step (``loop.keras_gil_wait``): timed here too,
    # the costlier case.
    steps.off_cpu, steps.loader_busy = ksteps.gil_clocks(steps.clock)
    cb = hooks.callback_class(keras.callbacks.Callback, rec, steps)(
        "fit", lambda a, b: 32, lambda a, b: 0, None, None)
    cb.on_epoch_begin(0)

    # The graph clock, made as the Keras hook makes it before the train function is traced:
    # the hooks below close each step against it, as watch does (reading its ring when due).
    fetch_clock = kclock.GraphClock(tf, lambda dt, batch: None)
    fetch_clock.make()
    steps.graph_clock = fetch_clock

    # 1. the loop thread's hooks, per step
    n_steps = 20_000

    def hook_steps() -> None:
        for i in range(n_steps):
            cb.on_train_batch_begin(i)
            steps.use(1)
            t0 = time.time()  # the timed call_function's two reads
            steps.graph_ran(t0, time.time())

    def empty_steps() -> None:
        for _ in range(n_steps):
            pass

    hooks_us = _alternate(rounds, lambda: _cpu_us_per(n_steps, empty_steps),
                          lambda: _cpu_us_per(n_steps, hook_steps))

    # 2. the fetch clock, per step: the same fetch traced before and after the clock is on
    x = np.random.default_rng(0).normal(size=(2000 * 32, 8)).astype("float32")
    y = np.zeros(2000 * 32, dtype="int64")
    base = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().prefetch(
        tf.data.AUTOTUNE)
    it = iter(base)

    end_clock = [False]

    def fetch(iterator: Any) -> Any:
        out = tf.reduce_sum(next(iterator)[0])
        if end_clock[0]:
            fetch_clock.ended(out)  # as the Keras hook clocks each step's results
        return out

    bare_fn = tf.function(fetch)
    bare_fn(it)  # traced bare
    kclock.clock_fetches(tf, fetch_clock, steps.clock)
    end_clock[0] = True
    clocked_fn = tf.function(fetch)
    clocked_fn(it)  # traced with the clock's ops
    n_fetch = 2000
    # the loop reads the ring every POLL_S: once in this many steps of ``step_ms``
    every = max(1, round(kclock.POLL_S * 1e3 / step_ms))

    def fetches() -> float:
        # Bare and clocked calls alternate one by one (blocks of calls drifted apart by more
        # than the difference on this host): the CPU of every thread during each call.
        spent = [0.0, 0.0]
        for i in range(2 * n_fetch):
            clocked = (i + i // 2) % 2  # bare, clocked, clocked, bare, ...
            c0 = time.process_time()
            (clocked_fn if clocked else bare_fn)(it)
            if clocked and (i // 2) % every == 0:
                fetch_clock.poll()  # right after a call, as watch reads it
            spent[clocked] += time.process_time() - c0
        return (spent[1] - spent[0]) / n_fetch * 1e6

    clock_us = [fetches() for _ in range(rounds)]

    # 3. the timed Context.call_function, per call
    from tensorflow.python.eager import context

    fn = tf.function(lambda t: t + 1.0)
    arg = tf.constant(1.0)
    fn(arg)
    n_calls = 5_000
    original = context.Context.call_function
    kcalls.time_graph_calls(steps)
    timed = context.Context.call_function
    steps.t_begin = steps.clock()  # inside a step window, as in training

    def calls(patch: Any) -> Callable[[], float]:
        def run() -> float:
            context.Context.call_function = patch

            def go() -> None:
                for _ in range(n_calls):
                    fn(arg)
            return _cpu_us_per(n_calls, go)
        return run

    call_us = _alternate(rounds, calls(original), calls(timed))
    context.Context.call_function = original
    return {"hooks_us": hooks_us, "clock_us": clock_us, "call_us": call_us}


PARENT = '''
import sys, threading, time, tempfile
from pathlib import Path
from stepscope.observe.watch import watch
seconds, script = float(sys.argv[1]), sys.argv[2]
rate = []

def steady():  # the parent's CPU while the command trains, after start-up: what a long run pays
    time.sleep(12.0)
    w0, c0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    rate.append((time.process_time() - c0) / (time.perf_counter() - w0))

threading.Thread(target=steady, daemon=True).start()
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    # 6,000 steps: ~25 s of training at this host's 3.5 ms, so a 10 s window after 12 s of
    # start-up ends while it still trains (1,500 had ended before 12 s + 20 s by 2026-12-06)
    watch([sys.executable, script, str(Path(tmp) / "out.json"), "6000", "pydataset",
           "tensorflow"], Path(tmp) / "run", interval_s=1.0)
    if not rate:
        sys.exit(f"the CNN trained {time.perf_counter() - t0:.0f} s, less than the 12 s of "
                 f"start-up and the {seconds:.0f} s window: use a shorter --parent-seconds")
print(rate[0])
'''


def _cnn_script(folder: str) -> Path:
    """bench/watch_keras_overhead.py's CNN script, written into ``folder``."""
    sys.path.insert(0, str(ROOT / "bench"))
    from watch_keras_overhead import write_script

    return write_script(Path(folder), "cnn.py")


def _parent_cpu_per_s(seconds: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = _cnn_script(tmp)
        out = subprocess.run([sys.executable, "-c", PARENT, str(seconds), str(script)],
                             check=True, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                  "TF_CPP_MIN_LOG_LEVEL": "3"})
    return float(out.stdout.strip().splitlines()[-1])


def _cnn_step_ms(runs: int) -> float:
    """The bare step of bench/watch_keras_overhead.py's CNN (its best epoch after the first)."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        script = _cnn_script(tmp)
        for i in range(runs):
            out = Path(tmp) / f"r{i}.json"
            subprocess.run([sys.executable, str(script), str(out), "150", "pydataset", "tensorflow"],
                           check=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            times.append(32e3 / json.loads(out.read_text())["images_per_s"])
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=None,
                    help="the step to express the cost against (default: time the bench CNN)")
    ap.add_argument("--parent-seconds", type=float, default=10.0)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    parent = _parent_cpu_per_s(args.parent_seconds)
    step_ms = args.step_ms or _cnn_step_ms(3)
    got = measure_child(args.rounds, step_ms)
    per_round = [h + m + c for h, m, c in
                 zip(got["hooks_us"], got["clock_us"], got["call_us"], strict=True)]
    med = {k: statistics.median(v) for k, v in got.items()}
    child_us = statistics.median(per_round)
    share = child_us / (step_ms * 1e3) + parent
    for k, v in got.items():
        print(f"{k}: median {med[k]:.1f} us (" + ", ".join(f"{x:.1f}" for x in v) + ")",
              file=sys.stderr)
    print(f"training process: {child_us:.1f} us a step (min {min(per_round):.1f}, max "
          f"{max(per_round):.1f}); watching parent {parent * 1e3:.1f} ms CPU a second; "
          f"against a {step_ms:.2f} ms step: {share * 100:.2f} % "
          f"(load {load0:.1f}-{os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(json.dumps({"figure": "watch_keras_step_cost_us", "value": round(child_us, 1),
                      "min": round(min(per_round), 1), "max": round(max(per_round), 1),
                      "runs": len(per_round), **{k: round(v, 1) for k, v in med.items()},
                      "parent_cpu_ms_per_s": round(parent * 1e3, 2),
                      "step_ms": round(step_ms, 2), "share_of_step": round(share, 4)}))


if __name__ == "__main__":
    main()
