"""Keras steps for ``stepscope watch``: where a Keras loop really waits for its batch.

Keras calls ``on_*_batch_begin`` on the main thread right before it runs a step, and, with
asynchronous callbacks, ``on_*_batch_end`` later on a thread pool. So a step is timed from one
batch-begin callback to the next (the first from the phase start, the last to the phase end),
and its data wait is measured where the loop blocks on its batch, per backend:

- TensorFlow (Keras 3 and tf-keras): the batch is fetched by ``iterator.get_next()`` inside the
  compiled train function, so callbacks never see the wait. The fetch is clocked where it
  waits, by ops around it in the graph (``GraphClock``, ``stepscope_watch_keras_clock``),
  whatever the pipeline is: a prefetch buffer that held the batch gives the fetch's own cost
  (~0.2-0.5 ms a step on this 2-core host, real: the same graph with its batch held in a
  constant ran that much faster), a pipeline that had none gives the time it took to make one.
  The loop reads the clock every ``POLL_S``, not every step (a read costs it ~100 us): a
  closed step waits in ``_unready`` until then, and is recorded in order with the rest.
- JAX and torch: the trainer pulls the batch with ``next()`` in Python on the main thread (JAX
  inside the train function, torch just before the batch-begin callback). stepscope times that
  ``next()`` (``TimedIterable``): the main thread was blocked exactly that long.

The user's own batch callbacks (``on_train_batch_begin``/``_end`` overridden by a callback passed
to ``fit``) are timed when they run on the loop's thread (a callback that is not ``async_safe``
runs there; an async-safe one runs on Keras's thread pool and holds nothing up): that time is
the step's ``other_s``, the overhead ``steps_per_execution`` would divide. Keras's own progress
bar is not timed (``verbose=2`` prints per epoch). On TensorFlow with no GPU the graph is timed
inside each step (below), and ``other_s`` is what the loop's thread ran outside the graph
calls: the callbacks, and Keras's per-batch Python (its CPU time there; see ``_settle``).

With ``steps_per_execution = n`` a step is n batches; their waits are summed as if the compute
between them were nil, an upper bound that is exact for n = 1.

On TensorFlow (Keras 3 and tf-keras) the train function's graph is timed apart from the step
(``time_graph_calls``): TensorFlow runs a ``tf.function``'s graph in ``Context.call_function``,
wrapped with a clock pair, and the start of the graph and the end of the step's work are
clocked in it (``GraphClock.ended``). The graph's time is the call's between the two: the
call's dispatch before (arguments, the executor's set-up) and its return after (the outputs
handed back, the GIL taken back) are the loop's. Each steady training step
gives its wall time and the graph's time; the rest of the step (the callbacks, Keras's
per-batch Python, the function's dispatch and return) is paid once per call, which
``steps_per_execution`` divides (fact ``loop.keras_train_calls``: sums, and per call the
graph's own work, less the data wait in it: median and 10th percentile).

Loading that runs Python in the training process holds the GIL while it runs: a PyDataset's
worker threads (on every backend), and the Python TensorFlow's own threads run as ops
(``Dataset.from_generator``, which Keras's PyDataset, Sequence and generator adapters use, and
``py_function`` or ``numpy_function`` maps). The loop's own Python between graph calls must take
the GIL back each time: with one loading thread busy the fetch in the graph was ~80 % of a step
and the loop waited for the GIL most of the rest; with two, the fetch was a quarter of it. On
JAX and torch the loop's ``next()`` rarely waits when two threads feed the queue, but every
other line of the loop waits for the GIL (a torch step's ops each give it up and take it back).
So for such inputs the loop thread's time *off its CPU* outside the graph's work (TensorFlow),
its timed pulls (JAX, torch) and the user's callbacks (wall less its CPU time, ``gil_clocks``)
is data wait too, up to the loading's busy time in the step: there the loop blocks on nothing
but the GIL (callbacks are asynchronous, the user's synchronous ones are subtracted) or a core,
and only loading threads hold the GIL or the cores between graph calls. That includes each
graph call's return after its work ended: with two loading threads busy it was ~5.5 ms of a
~12 ms call, a switch interval. The cap matters on a loaded host: there any GIL holder may lose
its core while holding it, and an idle pool's threads hold none. The graph's own time stays
compute (the loop's thread may run a little of it: that is not counted as waiting). On JAX the
loop may also block on the device's results outside ``next()``; with loading threads busy that
counts as data wait up to their busy time (not told apart).

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_keras_calls import TrainCalls
    from stepscope.observe.inject.stepscope_watch_keras_clock import GraphClock
    from stepscope.observe.inject.stepscope_watch_recorder import PhaseState, Recorder

ImagesFn = Callable[[int, int], int]
KERAS_STAGES_SEQ = "keras_stages.seq."  # the parent maps the child's phase number to its id
@dataclass(slots=True)
class _Closed:
    """A step the loop closed, with what its figures need: settled once the graph clock's
    rows for it are read (TensorFlow), recorded once its results are ready (JAX)."""

    phase: PhaseState
    t_start: float  # the window, on the steps' clock
    t: float
    wall: tuple[float, float]  # the same window on the graph clock's (time.time())
    blocked_s: float  # timed pulls and eager fetches
    images: int | None  # counted as pulled, if any
    first: int  # the step's first batch (Keras's count of its images, when needed)
    graph_s: float
    graph_calls: int
    last_call: tuple[float, float]
    per_step: int
    pull_s: float
    callback_s: float
    gil0: tuple[float, float]  # the GIL clocks as the window opened and closed
    gil: tuple[float, float]
    ready: Callable[[], float | None] | None  # JAX: when the step's results were ready
    loop_cpu: float = 0.0  # the loop thread's CPU outside the graph calls (graph_is_work)
    # from one batch-begin to the next: no iterator made, no epoch ended in the window
    between_batches: bool = False
    settled: bool = False
    wait: float = 0.0  # data wait and overhead, once settled
    other: float = 0.0


NO_FETCHES = (0, 0.0, -1, 0.0, 0.0)  # GraphClock.between where there is no graph clock
NO_GIL = (0.0, 0.0)  # KerasSteps._gil_now where loading runs no Python in the process
STAMP_WAIT_S = 0.05


def _stamp(ready: Callable[[], float | None], until: float) -> float:
    """When a step's results were ready, at a phase's end. Keras waited for them before it
    ended the phase, so the clocking thread stamps them within moments; ``until`` if not."""
    deadline = time.perf_counter() + STAMP_WAIT_S
    while (at := ready()) is None and time.perf_counter() < deadline:
        time.sleep(0.001)
    return until if at is None else at


class KerasSteps:
    """Step windows between batch-begin callbacks, with the data wait measured at the producer.

    Args:
        rec: the process's recorder (phases and steps go through it).
        count_images: images in a batch (the recorder's ``count_images``).
        clock: monotonic clock, the recorder's.
    """

    def __init__(self, rec: Recorder, count_images: Callable[[Any], int],
                 clock: Callable[[], float] | None = None) -> None:
        self.rec = rec
        # torch backend: the loop pulls batch k+1 before batch k+1's begin callback, so asking
        # for the next batch is what ends a step (as in a plain PyTorch loop).
        self.pull_cuts = False
        # JAX dispatches a step and returns before it has run: the loop may pull the next
        # batch while the device still computes. ``device_busy`` (set on JAX) says whether the
        # last step's results are still pending; a pull the device was busy through is not a
        # wait of the device for data.
        self.device_busy: Callable[[], bool] | None = None
        # JAX: starts waiting, off the loop's thread, for the last step's results; what it
        # returns gives the clock when they were ready (None: not yet).
        self.device_done: Callable[[], Callable[[], float | None]] | None = None
        # Steps closed by the loop and not recorded yet, in order: waiting for the graph
        # clock's next read (TensorFlow) or for their results (JAX); and the end of the last
        # step recorded (see ``_record``)
        self._unready: list[_Closed] = []
        self._device_end: float | None = None
        # ImageDataGenerator stage counters (stepscope_watch_keras_stages.LoaderStages), once
        # that module is imported; read at phase boundaries.
        self.stages: Any = None
        # free-form: the stage board's JSON counters (stepscope_watch_keras_stages.py)
        self.stages_delta: Callable[[dict[str, Any], dict[str, Any]], Any] = lambda a, b: None
        self._stages0: dict[str, Any] | None = None
        self.count_images = count_images
        self.clock = clock or rec.clock
        self.main_thread_id = rec.main_thread_id
        self.phase: PhaseState | None = None
        self.images_fn: ImagesFn = lambda first, last: 0
        self.t_begin: float | None = None
        self.t_start = 0.0
        self.first = 0
        self.blocked_s = 0.0
        self.callback_s = 0.0
        self.pulled_images = 0
        self.pulled = 0
        self.pull_s = 0.0  # the loop's time inside next() (JAX, torch; TensorFlow run eagerly)
        self.per_step = 1
        # The train function's graph, timed by ``time_graph_calls`` (TensorFlow only): the open
        # step's graph seconds and calls, its last call's wall-clock span (``time.time()``, the
        # graph clock's), and the run's steady training steps.
        self.graph_s = 0.0
        self.graph_calls = 0
        self.last_call = (0.0, 0.0)
        self.train_calls: TrainCalls | None = None
        self.callbacks_by: dict[str, float] = {}  # the user's batch callbacks by class, the run's
        # The loop thread's off-CPU clock and the loading threads' busy clock (see the module
        # doc), set while loading runs Python in this process; their readings at the open
        # step's start.
        self.off_cpu: Callable[[], float] | None = None
        self.loader_busy: Callable[[], float] | None = None
        self.off0 = self.busy0 = 0.0
        self.graph_clock: GraphClock | None = None  # the fetches' waits, clocked in the graph
        # TensorFlow with no GPU: a graph call runs its ops to the end before it returns, so
        # the graph's time is the step's work and the rest of the step is the loop's (see
        # ``_settle``). On a GPU its kernels are only queued by then.
        self.graph_is_work = False
        self.graph_is_work_probe: Callable[[], bool] | None = None  # asked at the first phase
        self.graph_cpu = 0.0  # the loop thread's CPU inside the open step's graph calls
        self.cpu0 = 0.0  # and its CPU clock as the step opened
        self.from_begin = False  # the open step's window opened at a batch-begin
        self.wall_from = 0.0  # the open step's start on the graph clock's clock (time.time())

    # -- producers -------------------------------------------------------------------------------
    def pull_begin(self, t: float) -> None:
        """The loop asks for a batch at ``t``; with ``pull_cuts`` that ends the open step."""
        if self.pull_cuts and self.t_begin is not None \
                and threading.get_ident() == self.main_thread_id:
            self._close(t)
            self.t_start = t

    def pulled_batch(self, dt: float, batch: Any, busy_before: bool = False,
                     busy_after: bool = False, idle_s: float | None = None) -> None:
        """The loop's thread spent ``dt`` in ``next()`` for ``batch`` (JAX, torch); the device
        was computing at its start/end (JAX; unknown elsewhere: False), and was idle the last
        ``idle_s`` of it, where that was clocked."""
        if threading.get_ident() != self.main_thread_id:
            return
        self.pull_s += dt
        if busy_after:  # the device computed through the whole pull: it did not wait
            dt = 0.0
        elif busy_before:
            # it finished during the pull: idle from then on; when that was not clocked, half.
            # A tiny model finishes within a ms of a 75 ms pull, and the half had held the JAX
            # worker-process rows to 71-78 % wait where ~95 % is true.
            dt = min(dt, max(idle_s, 0.0)) if idle_s is not None else dt * 0.5
        self.blocked_s += dt
        self.pulled += 1
        self.pulled_images += self.count_images(batch)

    def epoch_ending(self, t: float) -> None:
        """Keras ends the loader's epoch at ``t`` on the loop's thread, after the last batch (a
        PyDataset's pool stopped, the dataset's own ``on_epoch_end``): the open step ends
        there. The pool's stop (~0.85 s for two processes here) is the phase's time, not the
        last step's compute, where it had put 41-62 % wait on runs that waited ~95 %. (On JAX
        a step ends no earlier than its results are ready: see ``_record``.)"""
        if threading.get_ident() == self.main_thread_id:
            self._close(t)

    def use(self, per_step: int) -> None:
        """The loop's next step consumes ``per_step`` batches."""
        self.per_step = max(1, per_step)

    # -- the loop (main thread) ------------------------------------------------------------------
    def phase_begin(self, phase: str, images_fn: ImagesFn, workers: int | None,
                    numbered: int | None = None) -> None:
        if self.graph_is_work_probe is not None:
            self.graph_is_work, self.graph_is_work_probe = self.graph_is_work_probe(), None
        t = self.clock()
        self._close(t)
        self._record(until=t)
        self._device_end = None
        if self.phase is not None:
            self.rec.end_phase(self.phase, t)
            self._stage_fact(self.phase)
        self.phase = self.rec.begin_phase(phase, workers, t, numbered=numbered)
        self._stages0 = self.stages.snapshot() if self.stages is not None else None
        self.images_fn = images_fn
        self.t_start = t  # iterator creation and the first fetch belong to step 0
        self.t_begin = None
        self.from_begin = False
        self.wall_from = time.time()  # fetches before this are outside any step window
        self._reset()

    def batch_begin(self, batch: int) -> None:
        t = self.clock()
        if self.phase is None:
            return
        if self.t_begin is not None:  # no pull ended the step (TF, JAX): this begin does
            self._close(t, between_batches=self.from_begin)
            self.t_start = t
            self.from_begin = True
        self.t_begin = t
        self.first = batch

    def phase_end(self) -> PhaseState | None:
        """Close the open step and phase; returns the phase closed, if any."""
        t = self.clock()
        self._close(t)
        self._record(until=t)
        self._device_end = None
        ph, self.phase = self.phase, None
        if ph is not None:
            self.rec.end_phase(ph, t)
            self._stage_fact(ph)
        return ph

    def graph_ran(self, t0: float, t1: float, cpu: float = 0.0) -> None:
        """TensorFlow ran a function's graph from ``t0`` to ``t1`` (``time.time()``; any thread:
        only the loop's own calls, inside a step window, count), the calling thread on its CPU
        ``cpu`` seconds of it."""
        if self.t_begin is None or threading.get_ident() != self.main_thread_id:
            return
        self.graph_calls += 1
        self.graph_s += t1 - t0
        self.graph_cpu += cpu
        self.last_call = (t0, t1)

    def _calls_fact(self, ph: PhaseState) -> None:
        found = self.train_calls.fact(self.graph_is_work) if self.train_calls is not None \
            else None
        if ph.phase == "train" and found is not None:
            if self.callbacks_by:
                found["callbacks_by"] = {k: round(v, 6) for k, v in self.callbacks_by.items()}
            self.rec.fact("loop.keras_train_calls", found,
                          "watch: steady training steps (batch-begin to batch-begin) and the "
                          "time TensorFlow's Context.call_function ran inside them (the graph)")
            # A train function with no step-end clock (traced before the hooks: a model's own
            # ``make_train_function`` gets one, ``clock_function_ends``): the ring gets no row, and
            # its fetches, clocked or not, are never read. Its data wait reads 0 (or what the GIL
            # clock counted, not the fetch): say so.
            if self.graph_clock is not None and self.graph_clock.seen == 0 \
                    and self.rec.once("keras-unclocked"):
                self.rec.fact("loop.keras_wait_unclocked", found["calls"],
                              "watch: steady training steps whose graph calls were timed while "
                              "the graph clock got no step's end (a train function whose graph "
                              "has no step-end clock): their data wait was not measured")

    def _stage_fact(self, ph: PhaseState) -> None:
        self._calls_fact(ph)
        if self.stages is None or self._stages0 is None:
            return
        from_stages = self.stages_delta(self._stages0, self.stages.snapshot())
        self._stages0 = None
        if from_stages is not None:
            self.rec.fact(f"{KERAS_STAGES_SEQ}{ph.seq}", from_stages,
                          "watch: ImageDataGenerator load_img / random transform / standardize "
                          "and __getitem__ per loading thread, over the phase")

    def callback_ran(self, dt: float, name: str = "") -> None:
        """A user's batch callback (class ``name``) held the loop's thread for ``dt`` (the
        step's overhead)."""
        if threading.get_ident() == self.main_thread_id:
            self.callback_s += dt
            self.callbacks_by[name] = self.callbacks_by.get(name, 0.0) + dt

    def _gil_now(self) -> tuple[float, float]:
        """(the loop thread's off-CPU clock, the loading threads' busy clock) now; zeros when
        not watched (see ``gil_clocks``)."""
        if self.off_cpu is None or self.loader_busy is None:
            return NO_GIL
        return self.off_cpu(), self.loader_busy()

    def _reset(self, gil: tuple[float, float] | None = None, cpu: float | None = None) -> None:
        """A new step window opens; ``gil``, ``cpu``: the clocks as the last one closed (read
        if None)."""
        self.blocked_s = 0.0
        self.callback_s = 0.0
        self.pulled_images = 0
        self.pulled = 0
        self.pull_s = 0.0
        self.graph_s = 0.0
        self.graph_calls = 0
        self.graph_cpu = 0.0
        self.cpu0 = cpu if cpu is not None else time.thread_time() if self.graph_is_work else 0.0
        self.off0, self.busy0 = self._gil_now() if gil is None else gil

    def _close(self, t: float, between_batches: bool = False) -> None:
        # Once a step, on the thread that paces the loop, where each microsecond is one the
        # step takes longer: it stores what the step's figures need, and settling and sending
        # wait for the graph clock's next read (~7 us a step in a hot loop, where settling
        # each step as it closed took ~8.6; docs/performance.md).
        if self.t_begin is None or self.phase is None:
            return
        # read with ``t``, before the graph clock's read: that op gives up the GIL, and the
        # wait to take it back belongs to the next step, whose window opens at ``t``
        gil = self._gil_now()
        wall = time.time()
        cpu = time.thread_time() if self.graph_is_work else 0.0
        ready = None
        if self.device_done is not None and self.device_busy is not None and self.device_busy():
            ready = self.device_done()
        closed = _Closed(self.phase, self.t_start, t, (self.wall_from, wall), self.blocked_s,
                         self.pulled_images if self.pulled > 0 else None, self.first,
                         self.graph_s, self.graph_calls, self.last_call, self.per_step,
                         self.pull_s, self.callback_s, (self.off0, self.busy0), gil, ready,
                         cpu - self.cpu0 - self.graph_cpu, between_batches)
        unready = self._unready
        unready.append(closed)
        if self.graph_clock is None:
            self._settle(closed, NO_FETCHES)
            self._record()
        elif self.graph_clock.poll(pending=len(unready) * self.per_step):
            self._record()  # else no step closed since the last read can be settled yet
        self.t_begin = None
        self.wall_from = wall
        self._reset(gil, cpu)

    def _settle(self, c: _Closed, clocked: tuple[int, float, int, float, float]) -> None:
        """The closed step's data wait and overhead, from what the loop saw and ``clocked``
        (the fetches the graph clocked in its window, ``GraphClock.between``)."""
        fetches, waited, fetched_images, end, start = clocked
        wait = c.blocked_s
        in_graph = 0.0
        if fetches > 0:  # TensorFlow: the fetches clocked inside the graph calls
            wait += waited
            in_graph = waited
            if fetched_images >= 0:
                c.images = fetched_images
        graph = c.graph_s
        t0, t1 = c.last_call
        if c.graph_calls > 0 and t0 <= end <= t1:
            # the last call's dispatch, before its graph started, and its return after the
            # step's work ended are the loop's (a start clocked with an earlier end is older)
            graph -= t1 - end + (start - t0 if t0 <= start <= end else 0.0)
        span = max(c.t - c.t_start, 0.0)
        wait = min(wait, span)
        if self.train_calls is not None and c.graph_calls > 0 \
                and c.phase.phase == "train" and c.phase.steps >= c.phase.warm:
            # TensorFlow fetches the batch inside the graph: its wait is part of the graph time
            self.train_calls.add(span, graph, wait, c.per_step, c.callback_s)
        if self.off_cpu is not None and self.loader_busy is not None:
            # waiting for the GIL or a core the loading threads hold, while they were loading
            # (outside the graph's work, the pulls already counted and the user's callbacks)
            slept = c.gil[0] - c.gil0[0] - graph - c.pull_s - c.callback_s
            busy = c.gil[1] - c.gil0[1]
            wait = min(wait + max(min(slept, busy), 0.0), span)
        c.wait = wait
        if self.graph_is_work and c.graph_calls > 0 and c.phase.steps >= c.phase.warm \
                and c.between_batches:
            # The graph's own work (its time less the fetch's wait in it) is the step's compute;
            # outside it the loop runs its callbacks and Keras's per-batch Python, on its CPU:
            # that is other, which steps_per_execution divides. (A warm-up step traces the step
            # function in Python, and a phase's first and last steps make its iterator and end
            # its epoch: once a phase, not a call, so left in compute as before.) A 2-layer Dense net's 1 ms step
            # on this CPU was 0.1 ms of graph work and ~0.8 ms of that; counted as compute, the
            # run read "compute-bound" and was told mixed precision. The loop thread's time off
            # its CPU there (a core taken by another process) stays compute, as elsewhere:
            # counted as other, a convolution net beside a busy process read "overhead-bound".
            outside = max(span - wait - max(graph - in_graph, 0.0), 0.0)
            callbacks = min(c.callback_s, outside)
            own = max(c.loop_cpu - min(callbacks, c.loop_cpu), 0.0)  # a callback's CPU is its own
            c.other = callbacks + min(own, outside - callbacks)
        else:
            c.other = min(c.callback_s, max(span - wait, 0.0))
        c.settled = True

    def _record(self, until: float | None = None) -> None:
        """Send the closed steps whose figures are known and whose results are ready, in
        order; ``until``: the phase ends then, so every step is sent, none ending after it.

        On TensorFlow a step's clocked fetches are known once the loop has read the graph
        clock's ring after the step (``GraphClock.poll``, every ``POLL_S``; at a phase's end
        at once).

        JAX dispatches a step and returns before it has run, so the loop can run ahead of the
        device: three convolutions on JAX's CPU device had an epoch's 24 steps dispatched in
        ~40 ms, and the ~1.1 s of compute ran after the last batch was taken. Timed by the loop
        alone, each step held ~1.5 ms of dispatch and the epoch's compute sat in its last step,
        which the per-step split drops as an outlier. So a step whose results were pending
        when the loop closed it ends when they were ready (clocked off the loop's thread,
        ``device_done``), and starts where the step before it ended: the steps follow the
        device. A step the device finished before the loop closed it is the loop's window.
        Keeping the loop one step ahead instead (waiting for step k-1 after dispatching k)
        cost the run ~30 % of its throughput on this 2-core host (watched / bare 0.70, three
        pairs, ``bench/watch_keras_overhead.py --backend jax``); clocking costs it nothing
        measurable (0.96, 0.91-1.06, five pairs)."""
        while self._unready:
            c = self._unready[0]
            if not c.settled and self.graph_clock is not None:
                clocked = self.graph_clock.between(*c.wall)
                if clocked is None:
                    if until is None:
                        return
                    self.graph_clock.poll()
                    clocked = self.graph_clock.between(*c.wall) or NO_FETCHES
                self._settle(c, clocked)
            at = c.ready() if c.ready is not None else None
            if c.ready is not None and at is None:
                if until is None:
                    return
                at = _stamp(c.ready, until)
            end = max(c.t, at if at is not None else c.t)
            if until is not None:
                end = min(end, until)
            start = c.t_start if self._device_end is None \
                else min(max(c.t_start, self._device_end), end)
            self._unready.pop(0)
            self._device_end = end
            # else Keras's count: ``images_fn`` is still the step's phase's, as a phase's
            # start and end record every step closed before them (``until``)
            images = c.images if c.images is not None \
                else self.images_fn(c.first, c.first + c.per_step - 1)
            span = max(end - start, 0.0)
            wait = min(c.wait, span)
            other = min(c.other, span - wait)
            self.rec.send_step(c.phase, start, span, wait, 0.0, span - wait - other, other,
                               images)
            self.rec.tick(end)


def gil_clocks(clock: Callable[[], float]) -> tuple[Callable[[], float], Callable[[], float]]:
    """``(off_cpu, loader_busy)``: the calling thread's time off its CPU (``clock()`` less its
    CPU time: asleep, or runnable and waiting for a core; each thread reads its own) and the
    loading's busy seconds (PyDataset worker threads, ``threads_busy_now``, and Python ops on
    TensorFlow's threads, ``py_busy_now``). Only differences mean anything."""
    if TYPE_CHECKING:
        from stepscope.observe.inject.stepscope_watch_keras_clock import py_busy_now
        from stepscope.observe.inject.stepscope_watch_stages import threads_busy_now
    else:
        try:  # in the watched interpreter a top-level module (see sitecustomize)
            from stepscope_watch_keras_clock import py_busy_now
            from stepscope_watch_stages import threads_busy_now
        except ImportError:  # in-process, for stepscope.keras.Callback
            from stepscope.observe.inject.stepscope_watch_keras_clock import py_busy_now
            from stepscope.observe.inject.stepscope_watch_stages import threads_busy_now

    def off_cpu() -> float:
        return clock() - time.thread_time()

    def loader_busy() -> float:
        return threads_busy_now() + py_busy_now()

    return off_cpu, loader_busy


class TimedIterable:
    """Wraps what a JAX or torch epoch iterator pulls from, timing each ``next()``."""

    def __init__(self, inner: Any, steps: KerasSteps,
                 clock: Callable[[], float] | None = None) -> None:
        self.inner = inner
        self.steps = steps
        self.clock = clock or steps.clock  # the device's ready times are on the steps' clock

    def __iter__(self) -> Iterator[Any]:
        return _TimedIterator(iter(self.inner), self.steps, self.clock)

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # anything else Keras asks of the loader
        return getattr(self.inner, name)


class _TimedIterator:
    __slots__ = ("clock", "it", "steps")

    def __init__(self, it: Iterator[Any], steps: KerasSteps, clock: Callable[[], float]) -> None:
        self.it, self.steps, self.clock = it, steps, clock

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        steps = self.steps
        busy = steps.device_busy
        t0 = self.clock()
        steps.pull_begin(t0)
        before = busy() if busy is not None else False
        # the device computes into the pull: when it is done is clocked off this thread
        done = steps.device_done() if before and steps.device_done is not None else None
        batch = next(self.it)  # StopIteration ends the epoch, untimed
        t1 = self.clock()
        after = busy() if busy is not None else False
        t_done = done() if done is not None and not after else None
        steps.pulled_batch(t1 - t0, batch, before, after,
                           None if t_done is None else t1 - max(t_done, t0))
        return batch
