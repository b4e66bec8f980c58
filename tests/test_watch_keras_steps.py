"""The Keras step windows on a fake clock: where each backend's data wait lands in a step."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.keras_loader import stage_fields
from stepscope.observe.inject import stepscope_watch_keras_clock as kclock
from stepscope.observe.inject import stepscope_watch_keras_stages as kstages
from stepscope.observe.inject import stepscope_watch_recorder as recorder
from stepscope.observe.inject.stepscope_watch_keras_calls import TrainCalls
from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps, TimedIterable


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _setup() -> tuple[KerasSteps, _Clock, int, recorder.Recorder]:
    read_fd, write_fd = os.pipe()
    clock = _Clock()
    rec = recorder.Recorder(recorder.Channel(write_fd, clock=clock), clock=clock)
    return KerasSteps(rec, recorder.count_images, clock), clock, read_fd, rec


def _steps(rec: recorder.Recorder, read_fd: int) -> list[tuple[float, float, int]]:
    rec.channel.flush()
    os.close(rec.channel._fd)
    with os.fdopen(read_fd, "rb") as f:
        msgs = [json.loads(line) for line in f]
    return [(m[4], m[5], m[9]) for m in msgs if m[0] == "S"]  # wall, wait, images


class _FetchClock:
    """Stands in for ``GraphClock``: the fetches each step's ``between`` finds, as the graph
    wrote them, read at once."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, int]] = []
        self.end = 0.0  # the latest end of a step's graph work
        self.start = 0.0  # ... and the start of its graph
        self.seen = 1.0  # the ring's latest row: steps' ends were clocked

    def poll(self, pending: int | None = None) -> bool:
        return True  # read at once

    def between(self, t_from: float, t_to: float) -> tuple[int, float, int, float, float]:
        return (*(self.rows.pop(0) if self.rows else (0, 0.0, -1)), self.end, self.start)


def test_tensorflow_wait_is_the_fetch_clocked_in_the_graph() -> None:
    steps, clock, fd, rec = _setup()
    fetches = _FetchClock()
    steps.graph_clock = fetches  # type: ignore[assignment]
    steps.phase_begin("train", lambda a, b: 4, 1)
    steps.use(1)
    steps.batch_begin(0)
    clock.t += 1.4
    fetches.rows.append((1, 0.3, 8))  # the graph blocked 0.3 s in get_next
    steps.batch_begin(1)
    clock.t += 0.2
    fetches.rows.append((1, 0.0002, -1))  # an optional's fetch: size unknown, Keras's count
    steps.batch_begin(2)
    clock.t += 0.1
    steps.phase_end()  # no fetch seen: no wait
    got = _steps(rec, fd)
    assert got == [pytest.approx((1.4, 0.3, 8)), pytest.approx((0.2, 0.0002, 4)),
                   pytest.approx((0.1, 0.0, 4))]


class _Ring:
    """The graph clock's ring as ``GraphClock.ended`` writes it: a row of the running sums
    per step's end, at ``seq % RING_ROWS``; counts the loop's reads."""

    def __init__(self) -> None:
        self.rows = np.zeros((kclock.RING_ROWS, kclock.COLS))
        self.sums = [0.0] * kclock.COLS
        self.reads = 0

    def ended(self, fetches: int, waited: float, images: int, unknown: int = 0,
              start: float | None = None) -> float:
        time.sleep(0.001)  # the graph's work: its end is after the step's mark
        end = time.time()
        for k, v in enumerate((fetches, waited, images, unknown)):
            self.sums[k] += v
        self.sums[4], self.sums[5] = end, end if start is None else start
        self.sums[6] += 1
        self.rows[int(self.sums[6]) % kclock.RING_ROWS] = self.sums
        time.sleep(0.001)  # the call's return
        return end

    def read(self) -> np.ndarray:
        self.reads += 1
        return self.rows.copy()


def _ring_clock() -> tuple[kclock.GraphClock, _Ring]:
    ring = _Ring()
    clock = kclock.GraphClock(None, lambda dt, batch: None)
    clock.ring, clock.read = ring.rows, ring.read
    return clock, ring


def test_graph_clock_figures_are_the_ring_rows_between_two_marks() -> None:
    """The fetches of the steps whose graph work ended between two marks, differences of the
    running sums; nothing before the ring is read past the second mark; a fetch of unknown size
    makes the images unknown; the end and start are the latest row's."""
    clock, ring = _ring_clock()
    m0 = time.time()
    e1 = ring.ended(1, 0.25, 8)
    m1 = time.time()
    e2 = ring.ended(2, 0.5, 0, unknown=2, start=m1)
    m2 = time.time()
    assert clock.between(m0, m1) is None  # not read yet
    clock.poll()
    # the row's own end (and start: none given), not m1 within 10 ms: a 1 ms sleep lies
    # between them, which a loaded host can stretch past 10 ms
    assert clock.between(m0, m1) == (1, pytest.approx(0.25), 8, e1, e1)
    assert clock.between(m1, m2) == (2, pytest.approx(0.5), -1, e2, m1)
    m = time.time()
    assert clock.between(m2, m) is None
    clock.poll()
    assert clock.between(m2, m)[:3] == (0, 0.0, 0)  # no step's end since
    time.sleep(0.001)
    for _ in range(kclock.RING_ROWS + 10):  # the ring laps: rows lost, the sums are not
        ring.sums[0] += 1
        ring.sums[4] = time.time()
        ring.sums[6] += 1
        ring.rows[int(ring.sums[6]) % kclock.RING_ROWS] = ring.sums
    ring.ended(1, 0.0, 4)
    m3 = time.time()
    clock.poll()
    assert clock.between(m2, m3)[0] == kclock.RING_ROWS + 10 + 1


def test_graph_clock_leaves_out_a_row_whose_end_is_not_written_yet() -> None:
    """The graph writes a step's row beside its work and the step's end after it (a variable
    of its own): a row read in between, its end older than its start, is left out, and its
    fetches count in the next row read, as the sums run on."""
    clock, ring = _ring_clock()
    m0 = time.time()
    ring.ended(1, 0.25, 8)
    m1 = time.time()
    ring.ended(1, 0.5, 8, start=m1)
    at = int(ring.sums[6]) % kclock.RING_ROWS
    ring.rows[at, 4] = m0  # the end of the row's last lap: this step still runs
    clock.poll()
    assert clock.seen == ring.sums[6] - 1
    m2 = time.time()
    ring.ended(1, 0.125, 8, start=m2)
    m3 = time.time()
    clock.poll()
    assert clock.between(m0, m1)[:3] == (1, pytest.approx(0.25), 8)
    assert clock.between(m1, m3)[:3] == (2, pytest.approx(0.625), 16)


def test_tensorflow_steps_wait_for_the_ring_read_and_keep_their_order() -> None:
    """The loop reads the graph clock's ring at most every ``POLL_S``: a step closed between
    two reads is recorded at the next one, or at the phase's end, with its own fetches."""
    steps, clock, fd, rec = _setup()
    gclock, ring = _ring_clock()
    steps.graph_clock = gclock
    steps.phase_begin("train", lambda a, b: 4, 1)
    steps.use(1)
    for i in range(4):
        steps.batch_begin(i)
        clock.t += 0.1
        ring.ended(1, 0.01 * (i + 1), 8)
    steps.batch_begin(4)  # closes step 3 (the first close read the ring: 2 reads by now)
    sent_before_end = len(steps._unready)
    clock.t += 0.1
    steps.phase_end()  # no fetch: Keras's count, no wait
    assert ring.reads <= 3 and sent_before_end >= 1
    assert _steps(rec, fd) == [pytest.approx((0.1, 0.01 * (i + 1), 8)) for i in range(4)] \
        + [pytest.approx((0.1, 0.0, 4))]


def test_jax_pull_the_device_computed_through_is_no_wait() -> None:
    steps, clock, fd, rec = _setup()
    busy = [False]
    steps.device_busy = lambda: busy[0]

    def batches():  # type: ignore[no-untyped-def]
        for _ in range(2):
            clock.t += 0.2  # producing a batch takes 0.2 s
            yield (np.zeros((8, 4)), np.zeros(8))

    it = iter(TimedIterable(batches(), steps, clock))
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.batch_begin(0)
    next(it)               # device idle: 0.2 s of waiting
    clock.t += 0.1
    steps.batch_begin(1)
    busy[0] = True         # step 0 still computing through the whole pull
    next(it)
    clock.t += 0.1
    steps.phase_end()
    got = _steps(rec, fd)
    assert got[0] == pytest.approx((0.3, 0.2, 8))
    assert got[1] == pytest.approx((0.3, 0.0, 8))


def test_jax_pull_the_device_finished_during_waits_from_then() -> None:
    """A tiny model's step finishes ~1 ms into a 75 ms pull: the device waited the rest, as
    clocked off the loop's thread (``device_done``); without that clock, half the pull."""
    steps, clock, fd, rec = _setup()
    busy = [True]
    ready_at: list[float | None] = [None]
    steps.device_busy = lambda: busy[0]
    steps.device_done = lambda: lambda: ready_at[0]

    def batches():  # type: ignore[no-untyped-def]
        for _ in range(2):
            ready_at[0] = clock.t + 0.001
            clock.t += 0.075
            busy[0] = False
            yield (np.zeros((8, 4)), np.zeros(8))

    it = iter(TimedIterable(batches(), steps, clock))
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.batch_begin(0)
    next(it)
    clock.t += 0.001
    steps.batch_begin(1)
    busy[0] = True
    steps.device_done = None  # not clocked: half
    next(it)
    steps.phase_end()
    assert _steps(rec, fd) == [pytest.approx((0.076, 0.074, 8)), pytest.approx((0.075, 0.0375, 8))]


def test_torch_pull_ends_the_step() -> None:
    steps, clock, fd, rec = _setup()
    steps.pull_cuts = True

    def batches():  # type: ignore[no-untyped-def]
        for _ in range(2):
            clock.t += 0.2
            yield (np.zeros((4, 1)), np.zeros(4))

    it = iter(TimedIterable(batches(), steps, clock))
    steps.phase_begin("train", lambda a, b: 0, 1)
    next(it)             # batch 0 pulled before its begin callback
    steps.batch_begin(0)
    clock.t += 0.5       # compute
    next(it)             # asking for batch 1 ends step 0
    steps.batch_begin(1)
    clock.t += 0.5
    steps.phase_end()
    got = _steps(rec, fd)
    assert got == [pytest.approx((0.7, 0.2, 4)), pytest.approx((0.7, 0.2, 4))]


def test_image_data_generator_stage_figures() -> None:
    stages = kstages.LoaderStages()
    before = stages.snapshot()
    stages.add("load", 0.016, 2)
    stages.add("transform", 0.2)
    stages.add("preprocess", 0.004)
    stages.batch(0.25)
    raw = kstages.delta(before, stages.snapshot())
    fields = stage_fields(raw, 1.0)
    assert fields is not None and fields["images"] == 2
    assert fields["ms_per_image"] == pytest.approx({"load": 8.0, "transform": 100.0,
                                                    "preprocess": 2.0})
    assert fields["thread_busy_frac"] == pytest.approx([0.25])
    assert kstages.delta(before, before) is None


def _facts(rec: recorder.Recorder, read_fd: int) -> dict[str, object]:
    rec.channel.flush()
    os.close(rec.channel._fd)
    with os.fdopen(read_fd, "rb") as f:
        msgs = [json.loads(line) for line in f]
    return {m[1]: m[2] for m in msgs if m[0] == "F"}


def test_tensorflow_graph_time_is_split_from_the_step() -> None:
    """The graph TensorFlow ran inside each training step (``graph_ran``, as the wrapped
    ``Context.call_function`` reports it) against the step: warm-up steps left out, the data wait
    taken out of the graph (TensorFlow fetches the batch inside it), written at the phase end."""
    steps, clock, fd, rec = _setup()
    steps.train_calls = TrainCalls()
    fetches = _FetchClock()
    steps.graph_clock = fetches  # type: ignore[assignment]
    steps.phase_begin("train", lambda a, b: 8, 1)
    steps.use(1)
    graphs = [0.004] * recorder.WARMUP_STEPS + [0.007, 0.008, 0.009]
    for i, graph in enumerate(graphs):
        steps.batch_begin(i)
        t0 = clock.t
        fetches.rows.append((1, 0.001, 8))  # the fetch waited 1 ms inside the graph
        clock.t = t0 + graph
        steps.graph_ran(t0, clock.t)  # the call's graph, the wait inside it
        clock.t += 0.030              # the user's callback
    steps.phase_end()
    calls = _facts(rec, fd)["loop.keras_train_calls"]
    assert isinstance(calls, dict)
    assert calls["calls"] == 3 and calls["steps_per_execution"] == 1
    assert calls["graph_s"] == pytest.approx(0.024)
    assert calls["step_s"] == pytest.approx(0.024 + 3 * 0.030)
    assert calls["wait_s"] == pytest.approx(0.003)
    assert calls["work_median_s"] == pytest.approx(0.007)  # 8 ms of graph less 1 ms of wait


def test_graph_call_return_is_the_loops_and_its_gil_wait_is_data_wait() -> None:
    """A graph call that started 1 ms after the call (its dispatch, on the loop's CPU) and whose
    work ended 5 ms before it returned (both clocked in the graph): the loop's thread waited that
    long for the GIL a loading thread held. The graph's time is the call's between the two, and
    the loop's time off its CPU outside the graph's work, up to the loading's busy time, is data
    wait."""
    steps, clock, fd, rec = _setup()
    steps.train_calls = TrainCalls()
    fetches = _FetchClock()
    steps.graph_clock = fetches  # type: ignore[assignment]
    cpu, busy = [0.0], [0.0]
    steps.off_cpu = lambda: clock.t - cpu[0]
    steps.loader_busy = lambda: busy[0]
    steps.phase_begin("train", lambda a, b: 8, 1)
    steps.use(1)
    for i in range(recorder.WARMUP_STEPS + 2):
        steps.batch_begin(i)
        t0 = clock.t
        clock.t += 0.001                     # the dispatch, on the loop's CPU
        cpu[0] += 0.001
        fetches.start = clock.t
        fetches.rows.append((1, 0.010, 8))  # 10 ms blocked in get_next
        clock.t += 0.012                     # 2 ms of the graph's own work after it
        fetches.end = clock.t
        clock.t += 0.005                     # the return: waiting for the GIL
        steps.graph_ran(t0, clock.t)
        cpu[0] += 0.001                      # the loop's own Python, on its CPU
        clock.t += 0.003                     # ... and 2 ms more waiting for the GIL
        busy[0] += 0.020                     # a loading thread busy all along
    steps.phase_end()
    rec.channel.flush()
    os.close(rec.channel._fd)
    with os.fdopen(fd, "rb") as f:
        msgs = [json.loads(line) for line in f]
    got = [(m[4], m[5]) for m in msgs if m[0] == "S"]
    assert got[1:] == [pytest.approx((0.021, 0.017))] * (len(got) - 1)
    calls = next(m[2] for m in msgs if m[0] == "F" and m[1] == "loop.keras_train_calls")
    assert isinstance(calls, dict)
    assert calls["work_median_s"] == pytest.approx(0.002)  # to the graph's end, less the wait


def test_torch_loop_gil_wait_outside_next_is_data_wait() -> None:
    """torch (or JAX) with PyDataset worker threads: the pull is timed; the loop's time off its
    CPU outside it (its ops waiting to take the GIL back) is data wait too, up to the threads'
    busy time, and the pull is not counted twice."""
    steps, clock, fd, rec = _setup()
    steps.pull_cuts = True
    cpu, busy = [0.0], [0.0]
    steps.off_cpu = lambda: clock.t - cpu[0]
    steps.loader_busy = lambda: busy[0]

    def batches():  # type: ignore[no-untyped-def]
        for _ in range(3):
            clock.t += 0.010  # the queue had none ready: 10 ms asleep in next()
            busy[0] += 0.020
            yield (np.zeros((4, 1)), np.zeros(4))

    it = iter(TimedIterable(batches(), steps, clock))
    steps.phase_begin("train", lambda a, b: 0, 1)
    for i in range(2):
        next(it)
        steps.batch_begin(i)
        clock.t += 0.002  # the step's ops on the loop's CPU
        cpu[0] += 0.002
        clock.t += 0.030  # ... and waiting for the GIL between them
        busy[0] += 0.060
    next(it)  # ends step 1
    steps.phase_end()
    got = _steps(rec, fd)
    assert got[:2] == [pytest.approx((0.042, 0.040, 4))] * 2


def test_the_loaders_end_of_epoch_is_not_the_last_steps() -> None:
    """Keras stops a PyDataset's worker pool on the loop's thread after the epoch's last batch
    (``epoch_ending``): the last step ends there, and the stop is in no step."""
    steps, clock, fd, rec = _setup()
    steps.phase_begin("train", lambda a, b: 4, 1)
    steps.batch_begin(0)
    clock.t += 0.010  # the step
    steps.epoch_ending(clock.t)
    clock.t += 0.850  # the pool stops
    steps.phase_end()
    assert _steps(rec, fd) == [pytest.approx((0.010, 0.0, 4))]


def test_a_step_the_device_still_computes_at_the_loaders_end_ends_when_it_is_done() -> None:
    """JAX queues the epoch's steps faster than the device runs them: at the loader's epoch
    end the last step's results are pending, and the step ends when they are ready, during the
    pool's stop or after it (at the latest the phase's end, which Keras reaches after its own
    wait)."""
    steps, clock, fd, rec = _setup()
    busy: list[bool] = [True]
    ready_at: list[float | None] = [None]
    steps.device_busy = lambda: busy[0]
    steps.device_done = lambda: lambda: ready_at[0]

    def epoch(dispatch: float, stop: float, ready_after: float | None, tail: float) -> None:
        steps.phase_begin("train", lambda a, b: 4, 1)
        steps.batch_begin(0)
        clock.t += dispatch
        ready_at[0] = None if ready_after is None else clock.t + ready_after
        steps.epoch_ending(clock.t)
        clock.t += stop  # the pool stops
        clock.t += tail  # Keras waits for the device's results
        steps.phase_end()

    epoch(0.002, 0.850, 0.500, 0.100)  # done 0.5 s into the stop, which overlapped it
    epoch(0.002, 0.050, None, 1.000)  # never clocked: the phase's end
    busy[0] = False
    epoch(0.010, 0.850, None, 0.0)  # an idle device: the stop is in no step, as elsewhere
    assert _steps(rec, fd) == [pytest.approx((0.502, 0.0, 4)), pytest.approx((1.052, 0.0, 4)),
                               pytest.approx((0.010, 0.0, 4))]


def test_jax_steps_follow_the_device_when_the_loop_runs_ahead() -> None:
    """Three steps dispatched 1 ms apart, the device done with them at 0.1, 0.2 and 0.3 s:
    each step is 0.1 s, one after the other, not 1 ms of dispatch and a last step of 0.3 s."""
    steps, clock, fd, rec = _setup()
    t0 = clock.t
    ready = {0: t0 + 0.1, 1: t0 + 0.2, 2: t0 + 0.3}
    stamped: dict[int, float] = {}
    last = [0]
    steps.device_busy = lambda: clock.t < ready[last[0]]
    steps.device_done = lambda: (lambda k=last[0]: stamped.get(k))
    steps.phase_begin("train", lambda a, b: 4, 1)
    for k in range(3):
        steps.batch_begin(k)
        last[0] = k
        clock.t += 0.001  # dispatched
    steps.epoch_ending(clock.t)  # the last batch taken
    clock.t = t0 + 0.35  # Keras waits for the results
    stamped.update(ready)
    steps.phase_end()
    got = _steps(rec, fd)
    assert got == [pytest.approx((0.1, 0.0, 4))] * 3


GRAPH_CLOCK_SCRIPT = r'''
import os, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import script_ops
from stepscope.observe.inject import stepscope_watch_keras_clock as kclock

kclock.time_py_funcs(script_ops)
eager = []
clock = kclock.GraphClock(tf, lambda dt, batch: eager.append((dt, len(batch))))
kclock.clock_fetches(tf, clock, time.perf_counter)

def load(x):
    time.sleep(0.03)  # loading, in Python on tf.data's thread
    return x

def pipeline():
    ds = tf.data.Dataset.from_tensor_slices(np.zeros((64, 2), "float32")).batch(4)
    return ds.map(lambda x: tf.numpy_function(load, [x], tf.float32))

@tf.function
def step(it):
    out = tf.reduce_sum(next(it))
    clock.ended(out)
    return out

@tf.function
def steps_of_two(it):  # Keras's steps_per_execution loop: optional fetches in a while loop
    def body(i, total):
        opt = it.get_next_as_optional()
        total = total + tf.reduce_sum(opt.get_value())
        clock.ended(total)  # as tf-keras's loop body ends each step
        return i + 1, total

    return tf.while_loop(lambda i, _: i < 2, body, [tf.constant(0), tf.constant(0.0)])[1]

assert not kclock.py_funcs_made()
busy0 = kclock.py_busy_now()
it = iter(pipeline())  # no prefetch: each fetch waits for its batch
assert kclock.py_funcs_made()
clock.make()
w0 = time.time()
for _ in range(3):
    t0 = time.time()
    step(it)
    t1 = time.time()
assert clock.between(w0, t1) is None  # the ring not read since
clock.poll()
n, waited, images, end, start = clock.between(w0, t1)
assert n == 3 and images == 12 and 0.08 <= waited <= 0.5, (n, waited, images)
assert t0 <= start <= end <= t1, (t0, start, end, t1)  # the last call's graph, inside it
assert end - start >= 0.025, (start, end)  # its fetch waited 30 ms for the map
assert kclock.py_busy_now() - busy0 >= 0.085
steps_of_two(it)  # traced, while tf.data's injected prefetch fills behind it
t0 = time.time()
steps_of_two(iter(pipeline()))
t1 = time.time()
clock.poll()
n, waited, images, end, start = clock.between(t0, t1)
assert n == 2 and images == 8 and waited >= 0.04, (n, waited, images)
# a loop's body starts once a batch, not as the call does: its fetch clocks no graph start
assert t0 <= end <= t1 and start < t0, (t0, start, end, t1)
it = iter(pipeline().prefetch(4))  # a full buffer: the fetch costs only itself
step(it)
time.sleep(kclock.POLL_S + 0.05)
t0 = time.time()
step(it)
t1 = time.time()
clock.poll(pending=1)  # read at once: a quarter of the ring is not due, but POLL_S has passed
n, waited, images, _, _ = clock.between(t0, t1)
assert n == 1 and images == 4 and waited < 0.02, (n, waited, images)
next(it)  # fetched eagerly, in Python
assert len(eager) == 1 and eager[0][1] == 4, eager
print("CLOCK OK")
'''


def test_the_fetch_is_clocked_inside_the_graph() -> None:
    """On real TensorFlow, in its own process: a fetch that waits for a Python ``map`` is clocked
    at that wait, a fetch from a full prefetch buffer at nearly nothing, the optional fetches of
    a ``steps_per_execution`` loop each once with their batches' size, an eager fetch in Python;
    the end of a step's graph work falls inside its call; the Python ops' busy time is
    counted."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GRAPH_CLOCK_SCRIPT], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in (str(Path(__file__).parents[1] / "src"),
                                          os.environ.get("PYTHONPATH")) if p)})
    assert done.returncode == 0 and "CLOCK OK" in done.stdout, done.stderr[-3000:]


def test_ready_clock_stamps_when_the_result_was_ready_and_leaves_with_the_main_thread() -> None:
    """``ReadyClock`` waits off the loop's thread; the stamp is when the wait returned."""
    from stepscope.observe.inject.stepscope_watch_keras_backends import ReadyClock

    class Leaf:
        def __init__(self, s: float) -> None:
            self.s = s

        def block_until_ready(self) -> None:
            time.sleep(self.s)

    rc = ReadyClock(time.perf_counter)
    t0 = time.perf_counter()
    got = rc.watch(Leaf(0.05))
    assert got() is None  # still computing
    deadline = time.perf_counter() + 5.0
    while got() is None and time.perf_counter() < deadline:
        time.sleep(0.01)
    stamp = got()
    assert stamp is not None and stamp - t0 >= 0.05
    assert rc.thread is not None and rc.thread.is_alive() and not rc.thread.daemon
    leaf = Leaf(0.0)
    assert rc.watch(leaf) is rc.watch(leaf)  # closed, then pulled into: waited for once
