"""Which of ``stepscope watch``'s graph clocks costs a Keras/TensorFlow step its throughput?

Whole-run pairs (``bench/watch_keras_overhead.py``) compare two processes, so a host whose speed
drifts from minute to minute (other tenants) moves each pair by more than the few per cent in
question. Here one process holds three copies of the same small CNN (``bench/keras_cnn.py``,
the overhead bench's), each with its train function traced under a different part of watch's
Keras hooks:

- ``bare``: traced before any hook is installed;
- ``fetch``: traced with the fetch clock alone (ops around each ``get_next``,
  ``GraphClock.clocked``; no step end: before 2026-12-06 the fallback end clock was in);
- ``fetch+end``: traced with the fetch clock and the step-end clock (``GraphClock.ended``), as
  ``stepscope watch`` traces it.

Epochs of the three then alternate, in a rotating order, over the same input: the Python hooks
(the epoch iterator's, the timed graph calls) are installed for all three alike, so the
difference between copies is only what the clocks put in the graph. A round is one epoch of each;
the figure is each copy's throughput ÷ ``bare``'s in the same round, median over rounds.
Drift within a round still counts: at 60 steps an epoch (~1 s) single rounds read 0.50-1.10 on a
busy host (2026-12-03), and one run's 0.50 for ``fetch+end`` did not come back in the next two.
Use long epochs and many rounds.

``--interleave step`` alternates single steps instead of epochs: each copy's train function is
called on its own endless ``tf.data`` iterator, a call at a time, in a rotating order, and the
clocked copies' calls include the loop's read of the clock's ring (``GraphClock.poll``), made as
watch makes it: right after a call, once a copy's own calls add up to ``POLL_S`` (every
``--read-every N``th round instead, a what-if; ``--read-every 1`` reads after every call, as
watch did before the ring).
Each copy's figure is its median call's wall time and its mean CPU time (all the process's
threads) less ``bare``'s, in microseconds, and where the wall time goes: in the graph
(``Context.call_function``, where TensorFlow runs it), in the loop's read of the clock, and the
rest, outside the graph (Python's side of the call: its captured inputs, Keras's ``Optional``). A fourth copy,
``bare-last``, is traced bare after the others: copies of one model traced at different times
differ by themselves (memory layout, thread placement), and its difference from ``bare`` is how
far apart two identical copies read in this run.

Usage:
    PYTHONPATH=src .venv/bin/python bench/watch_keras_clock_ab.py [--rounds 8] [--steps 150]
        [--input pydataset|tfdata] [--interleave epoch|step] [--read-every N]

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

import keras_cnn  # bench/keras_cnn.py: bench/ is this script's folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    ap.add_argument("--input", choices=("pydataset", "tfdata"), default="pydataset")
    ap.add_argument("--interleave", choices=("epoch", "step"), default="epoch",
                    help="alternate whole epochs through fit, or single train-function calls "
                         "(tf.data input; --rounds are then rounds of one step per copy)")
    ap.add_argument("--read-every", type=int, default=0,
                    help="with --interleave step: the clocked copies read the clock in every "
                         "Nth round (a what-if; default 0: as watch does, every POLL_S of a "
                         "copy's own calls)")
    ap.add_argument("--read-timing", action="store_true",
                    help="with --interleave step: time the clock's read alone (right after a "
                         "call, a second read at once, and one after 2 ms asleep) and stop")
    args = ap.parse_args()
    if args.interleave == "step" and args.input != "tfdata":
        ap.error("--interleave step feeds each copy its own tf.data iterator: use --input tfdata")

    import keras
    import numpy as np
    from keras.src.backend.tensorflow import trainer
    from tensorflow.python.data.ops import iterator_ops

    from stepscope.observe.inject import stepscope_watch_keras_backends as backends
    from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps
    from stepscope.observe.inject.stepscope_watch_recorder import Channel, Recorder, count_images

    n = args.steps * keras_cnn.BATCH
    x_all, y_all = keras_cnn.arrays(np, n)

    def data() -> Any:
        return keras_cnn.batches(args.input, x_all, y_all)

    def model() -> Any:
        return keras_cnn.model(keras)

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
    steps = KerasSteps(rec, count_images)
    backends.patch_backend("tensorflow", rec, steps)
    clocked = (iterator_ops.OwnedIterator._next_internal,
               iterator_ops.OwnedIterator.get_next_as_optional)
    with_end = trainer.TensorFlowTrainer._autoconvert_optionals

    # fetch only: the step-end wrapper is taken out while this copy traces, and so is the
    # fallback that clocks the end of any traced function that fetched and whose end nobody
    # clocked (``clock_function_ends``): until 2026-12-06 it clocked this copy's end too
    clock = steps.graph_clock
    trainer.TensorFlowTrainer._autoconvert_optionals = _unwrapped(with_end)
    clock.ended = lambda outputs: None  # the instance's, over the class's method
    copies["fetch"] = model()
    epoch(copies["fetch"])
    del clock.ended
    trainer.TensorFlowTrainer._autoconvert_optionals = with_end
    copies["fetch+end"] = model()
    epoch(copies["fetch+end"])
    assert (iterator_ops.OwnedIterator._next_internal,
            iterator_ops.OwnedIterator.get_next_as_optional) == clocked != originals

    if args.interleave == "step":
        # the fourth copy, traced bare last: the clocks and the step-end wrapper taken out
        iterator_ops.OwnedIterator._next_internal, \
            iterator_ops.OwnedIterator.get_next_as_optional = originals
        trainer.TensorFlowTrainer._autoconvert_optionals = _unwrapped(with_end)
        copies["bare-last"] = model()
        epoch(copies["bare-last"])
        iterator_ops.OwnedIterator._next_internal, \
            iterator_ops.OwnedIterator.get_next_as_optional = clocked
        trainer.TensorFlowTrainer._autoconvert_optionals = with_end
        if args.read_timing:
            _read_timing(copies["fetch+end"], steps.graph_clock, iter(data().repeat()),
                         args.rounds)
            return
        _step_rounds(copies, steps.graph_clock, args.rounds,
                     lambda: iter(data().repeat()), args.read_every)
        return

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


def _step_rounds(copies: dict[str, Any], clock: Any, rounds: int,
                 iterator: Any, read_every: int = 0) -> None:
    """One train-function call of each copy a round, rotating; prints the per-call figures."""
    from stepscope.observe.inject.stepscope_watch_keras_clock import POLL_S

    names = list(copies)
    its = {k: iterator() for k in names}
    clocked = {"fetch", "fetch+end"}
    traced = {k: _tracing_count(copies[k]) for k in names}
    for _ in range(20):  # warm
        for k in names:
            copies[k].train_function(its[k])
    # The hooks are installed now: a copy traced again for these iterators would be clocked.
    again = [k for k in names if _tracing_count(copies[k]) != traced[k]]
    if again:
        sys.exit(f"traced again for the step iterators, under the hooks: {again}")
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    graph: dict[str, list[float]] = {k: [] for k in names}
    read: dict[str, list[float]] = {k: [] for k in names}
    own = dict.fromkeys(names, 0.0)  # a copy's own time since its last read
    in_graph = _time_graphs()
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            in_graph[0] = 0.0
            t0, c0 = time.perf_counter(), time.process_time()
            copies[k].train_function(its[k])
            t1 = time.perf_counter()
            own[k] += t1 - t0
            if k in clocked and (r % read_every == 0 if read_every else own[k] >= POLL_S):
                clock.poll()
                own[k] = 0.0
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            graph[k].append(in_graph[0])
            read[k].append(wall[k][-1] - (t1 - t0))
    half = rounds // 2
    med = {k: statistics.median(wall[k]) * 1e6 for k in names}
    mean_cpu = {k: statistics.fmean(cpu[k]) * 1e6 for k in names}
    # the mean carries a read made every Nth round only; the median is a call without one
    mean = {k: statistics.fmean(sorted(wall[k])[:int(0.95 * rounds)]) * 1e6 for k in names}
    halves = {k: [round((statistics.median(wall[k][h]) - statistics.median(wall["bare"][h]))
                        * 1e6) for h in (slice(0, half), slice(half, None))] for k in names[1:]}
    print(f"bare call: median {med['bare']:.0f} us wall, {mean_cpu['bare']:.0f} us CPU; "
          "less bare (wall median, its halves; CPU mean): "
          + ", ".join(f"{k} {med[k] - med['bare']:+.0f} {halves[k]} {mean_cpu[k] - mean_cpu['bare']:+.0f}"
                      for k in names[1:])
          + "; wall, mean of the fastest 95 %: "
          + ", ".join(f"{k} {mean[k] - mean['bare']:+.0f}" for k in names[1:]))
    split = {k: {"graph": round((statistics.median(graph[k]) - statistics.median(graph["bare"]))
                                * 1e6),
                 "read": round(statistics.median(read[k]) * 1e6),
                 "read_mean": round(statistics.fmean(read[k]) * 1e6),
                 "outside": round((statistics.median(w - g - rd for w, g, rd in
                                                     zip(wall[k], graph[k], read[k], strict=True))
                                   - statistics.median(w - g for w, g in
                                                       zip(wall["bare"], graph["bare"], strict=True)))
                                  * 1e6)}
             for k in names[1:]}
    print("where, less bare (median us): " + ", ".join(
        f"{k}: graph {v['graph']:+d}, read {v['read']} (mean {v['read_mean']}), "
        f"outside {v['outside']:+d}"
        for k, v in split.items()))
    print(json.dumps({"figure": "watch_keras_clock_ab_steps", "rounds": rounds,
                      "read_every": read_every,
                      "bare_call_us": round(med["bare"]),
                      "wall_us": {k: round(med[k] - med["bare"]) for k in names[1:]},
                      "wall_us_halves": halves,
                      "wall_mean95_us": {k: round(mean[k] - mean["bare"]) for k in names[1:]},
                      "cpu_us": {k: round(mean_cpu[k] - mean_cpu["bare"]) for k in names[1:]},
                      "split_us": split}))


def _read_timing(m: Any, clock: Any, it: Any, rounds: int) -> None:
    """What the clock's read (``GraphClock.poll``, one eager op) costs where watch makes it,
    right after a train-function call, against a second read at once and one after 2 ms
    asleep: the op's cost depends on what TensorFlow's runtime was doing before it."""
    for _ in range(30):
        m.train_function(it)
        clock.poll()
    first, second, slept = [], [], []
    for _ in range(rounds):
        m.train_function(it)
        t0 = time.perf_counter()
        clock.poll()
        t1 = time.perf_counter()
        clock.poll()
        first.append(t1 - t0)
        second.append(time.perf_counter() - t1)
    for _ in range(rounds):
        m.train_function(it)
        time.sleep(0.002)
        t0 = time.perf_counter()
        clock.poll()
        slept.append(time.perf_counter() - t0)
    med = {k: round(statistics.median(v) * 1e6) for k, v in
           (("after_call", first), ("second", second), ("after_2ms_asleep", slept))}
    print("the clock's read, median us: " + ", ".join(f"{k} {v}" for k, v in med.items()))
    print(json.dumps({"figure": "watch_keras_clock_read_us", "rounds": rounds, **med}))


def _time_graphs() -> list[float]:
    """Adds the seconds every graph call runs in TensorFlow (``Context.call_function``, below
    watch's own timer) to the returned cell, which the caller zeroes."""
    from tensorflow.python.eager import context

    spent = [0.0]
    inner = context.Context.call_function

    def call_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    context.Context.call_function = call_function
    return spent


def _tracing_count(model: Any) -> int:
    """How often the train function's ``tf.function`` traced: it sits in the closure Keras
    returns, or deeper where that function is itself wrapped (a few closures down at most)."""
    seen: set[int] = set()
    todo = [(model.train_function, 0)]
    while todo:
        fn, depth = todo.pop()
        if hasattr(fn, "experimental_get_tracing_count"):
            return int(fn.experimental_get_tracing_count())
        if id(fn) in seen or depth >= 4:
            continue
        seen.add(id(fn))
        todo += [(cell.cell_contents, depth + 1)
                 for cell in getattr(fn, "__closure__", None) or () if _filled(cell)]
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            todo.append((wrapped, depth + 1))
    sys.exit("could not find the train function's tf.function in Keras's closure")


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


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
