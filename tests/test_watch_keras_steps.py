"""The Keras step windows on a fake clock: where each backend's data wait lands in a step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.keras_loader import stage_fields
from stepscope.observe.inject import stepscope_watch_keras_stages as kstages
from stepscope.observe.inject import stepscope_watch_recorder as recorder
from stepscope.observe.inject.stepscope_watch_keras_marks import MarkLog, mark_dataset
from stepscope.observe.inject.stepscope_watch_keras_steps import (
    KerasSteps,
    TimedIterable,
    TrainCalls,
)


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


def test_tensorflow_wait_is_ready_minus_request() -> None:
    steps, clock, fd, rec = _setup()
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.use(7, 1)
    clock.t += 0.5
    steps.batch_begin(0)            # the step asks for batch 0 at 100.5
    clock.t = 101.3
    steps.batch_ready(7, 8, 101.0)  # first request after 0.5 s of tracing; ready at 101.3
    clock.t = 101.35
    steps.batch_ready(7, 8, 101.3)  # batch 1 prefetched: asked at 101.3, ready at 101.35
    clock.t = 101.4
    steps.batch_begin(1)            # batch 1 was waiting in the buffer: no wait
    clock.t = 101.6
    steps.phase_end()
    got = _steps(rec, fd)
    # Step 0 runs from the phase start; it waited ready - max(begin, request) = 0.3 s, not the
    # tracing. Step 1 found its batch ready.
    assert got[0] == pytest.approx((1.4, 0.3, 8))
    assert got[1] == pytest.approx((0.2, 0.0, 8))


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


def test_new_iterator_keeps_the_open_steps_batch() -> None:
    steps, clock, fd, rec = _setup()
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.use(3, 1)
    steps.batch_begin(0)
    clock.t += 0.1
    steps.batch_ready(3, 8, 100.0)
    clock.t += 0.1
    steps.new_iterator(3)  # Keras makes the next epoch's iterator before the phase ends
    steps.phase_end()
    assert _steps(rec, fd)[0][2] == 8


def test_a_batch_the_old_iterator_asked_for_is_never_paired_with_a_step() -> None:
    """tf.data's injected prefetch lets the last epoch's iterator ask for one batch more, ready
    after the next epoch's iterator was made: it must not shift every later step by one (each
    step would be paired with the batch before its own, ready before the step began: no wait
    at all, as seen with tf-keras and a Sequence on worker threads)."""
    steps, clock, fd, rec = _setup()
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.use(3, 1)
    steps.phase_end()
    clock.t = 101.0
    steps.new_iterator(3)           # epoch 2's iterator
    clock.t = 101.1
    steps.batch_ready(3, 8, 100.9)  # the old iterator's extra batch lands now
    steps.phase_begin("train", lambda a, b: 0, 1)
    steps.batch_begin(0)
    clock.t = 101.4
    steps.batch_ready(3, 8, 101.1)  # epoch 2's batch 0: 0.3 s of loading
    clock.t = 101.5
    steps.phase_end()
    assert _steps(rec, fd)[-1] == pytest.approx((0.4, 0.3, 8))


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
    steps.phase_begin("train", lambda a, b: 8, 1)
    steps.use(7, 1)
    graphs = [0.004] * recorder.WARMUP_STEPS + [0.007, 0.008, 0.009]
    for i, graph in enumerate(graphs):
        steps.batch_begin(i)
        t0 = clock.t
        clock.t += 0.001
        steps.batch_ready(7, 8, t0)   # asked for at the call's start, ready 1 ms later
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


class _Pipeline:
    """A tf.data pipeline as the list of its stages (enough for ``mark_dataset``)."""

    def __init__(self, stages: list[str]) -> None:
        self.stages = stages

    def repeat(self) -> _Pipeline:
        return _Pipeline([*self.stages, "repeat"])

    def map(self, fn: object) -> _Pipeline:
        return _Pipeline([*self.stages, "map"])

    def prefetch(self, n: int) -> _Pipeline:
        return _Prefetch(self, n)


class _Prefetch(_Pipeline):
    def __init__(self, inner: _Pipeline, n: int) -> None:
        super().__init__([*inner.stages, f"prefetch({n})"])
        self._input_dataset, self._buffer_size = inner, n


_Prefetch.__name__ = "_PrefetchDataset"  # the class tf.data's prefetch() returns


def test_the_mark_adds_no_prefetch_buffer_to_the_pipeline() -> None:
    # Appended after the user's prefetch, the mark's map would be a synchronous last stage and
    # tf.data would inject a second prefetch buffer there: watched runs ran 5-19 % faster.
    from types import SimpleNamespace

    ds = SimpleNamespace(from_tensors=lambda x: _Pipeline(["clock"]),
                         zip=lambda pair: _Pipeline([f"zip({'+'.join(pair[1].stages)})"]))
    tf = SimpleNamespace(constant=lambda v, dtype: v, int64="int64", timestamp=lambda: 0.0,
                         data=SimpleNamespace(Dataset=ds))
    steps = _setup()[0]
    prefetched = mark_dataset(tf, _Pipeline(["generator"]).prefetch(-1), steps, 1)
    assert prefetched.stages == ["zip(generator)", "map", "prefetch(-1)"]
    plain = mark_dataset(tf, _Pipeline(["generator", "map"]), steps, 1)
    assert plain.stages == ["zip(generator+map)", "map"]  # tf.data injects its prefetch after


def test_mark_log_reads_whole_lines_across_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The marks' file: a half-written line waits for its end; past the size limit the file is
    unlinked, and a writer that still holds it open (its line in flight) is not lost."""
    monkeypatch.setattr(MarkLog, "ROTATE_BYTES", 64)
    log = MarkLog(offset=0.0)
    try:
        with open(log.path, "a") as f:
            f.write("7 100 200 8\n7 300 4")
            f.flush()
            assert log.read() == [(7, 100, 200, 8)]
            f.write("00 8\n")
            f.flush()
            assert log.read() == [(7, 300, 400, 8)]
            f.write("7 500 600 8\n" * 5)  # past 64 bytes: read, then the file is unlinked
            f.flush()
            assert len(log.read()) == 5 and os.path.exists(log.path)
            f.write("7 700 800 8\n")  # an in-flight writer's line lands in the old inode
            f.flush()
        with open(log.path, "a") as g:  # the next line makes a new file at the path
            g.write("3 900 950 16\n")
        assert log.read() == [(7, 700, 800, 8), (3, 900, 950, 16)]
    finally:
        log.close()
    assert not os.path.exists(log.path)


def test_a_request_noted_late_counts_from_the_graph_calls_start() -> None:
    """Without a prefetch, a generator's batch is asked for inside the train function; its
    ``py_func`` may first wait for the GIL behind loading threads, so its own clock notes the
    request late. The wait counts from the graph call's start, except in a phase's first step,
    where the call first builds its graph and asks only after."""
    steps, clock, fd, rec = _setup()
    steps.phase_begin("train", lambda a, b: 8, 1)
    steps.use(7, 1)
    # (begin, graph call start, request noted, ready, graph call end) of steps 0 and 1
    for begin, t0, asked, ready, t1 in ((100.0, 100.01, 100.5, 100.6, 100.61),
                                        (100.62, 100.63, 100.68, 100.82, 100.83)):
        clock.t = begin
        steps.batch_begin(0 if begin == 100.0 else 1)
        clock.t = ready
        steps.batch_ready(7, 8, asked)
        clock.t = t1
        steps.graph_ran(t0, t1)
    clock.t = 100.84
    steps.batch_begin(2)
    steps.phase_end()
    waits = [w for _, w, _ in _steps(rec, fd)[:2]]
    # step 0: from its own request (building the graph, 0.49 s, is no wait); step 1: from the
    # graph call's start (the request held up 0.05 s behind the GIL is)
    assert waits == [pytest.approx(0.1), pytest.approx(0.19)]


TIMED_GENERATOR_SCRIPT = r'''
import os, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
from stepscope.observe.inject.stepscope_watch_keras_marks import time_generators, timed_generator

class Steps:
    clock = staticmethod(time.monotonic)
    mark_log = None
    count_images = staticmethod(lambda batch: len(batch[0]))
    def __init__(self):
        self.notes = []
    def batch_ready(self, token, images, requested, ready=None):
        self.notes.append((token, images, requested, ready))

closed = []
def gen():
    try:
        for _ in range(5):
            time.sleep(0.02)  # loading
            yield np.zeros((4, 2), "float32"), np.zeros(4, "int64")
    finally:
        closed.append(True)

time_generators(tf)
spec = (tf.TensorSpec((None, 2), tf.float32), tf.TensorSpec((None,), tf.int64))
source = tf.data.Dataset.from_generator(gen, output_signature=spec)
ds = source.prefetch(2).with_options(tf.data.Options())
timed = timed_generator(ds)
assert timed is not None
assert timed_generator(source.map(lambda x, y: (x, y)).prefetch(2)) is None  # map: mark it
assert timed_generator(tf.data.Dataset.range(3).prefetch(1)) is None
steps = Steps()
timed.attach(steps, 7)
assert sum(1 for _ in ds) == 5
assert [n[:2] for n in steps.notes] == [(7, 4)] * 5, steps.notes
assert all(ready - requested >= 0.015 for _, _, requested, ready in steps.notes), steps.notes
assert closed == [True]
print("TIMED OK")
'''


def test_a_python_generator_is_timed_where_it_yields() -> None:
    """``from_generator`` pipelines (Keras's PyDataset and generator adapters) are timed in
    Python, on real TensorFlow in its own process: every batch noted once under the loop's
    token, its loading inside the span, the user's generator closed with tf.data's."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", TIMED_GENERATOR_SCRIPT], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in (str(Path(__file__).parents[1] / "src"),
                                          os.environ.get("PYTHONPATH")) if p)})
    assert done.returncode == 0 and "TIMED OK" in done.stdout, done.stderr[-3000:]
