"""How long a TensorFlow train function waited for its batch, and when its graph's work ended,
clocked in the graph.

Keras (3 on TensorFlow, and tf-keras) fetches each batch inside its compiled train function:
``iterator.get_next()`` (or ``get_next_as_optional()`` with ``steps_per_execution > 1``) is an op
of the graph, and the graph blocks on it until the input pipeline has a batch. So the wait is
clocked there, the consumer's side, whatever the pipeline is (a Python generator, ``tf.data``
maps, a prefetch buffer): each fetch traced into a graph gets a clock op before it and one after
the batch's tensors, and adds (1, the difference, the batch's size, 1) to a running sum held in
one small variable (``GraphClock``): the last column numbers the fetches. Beside each step's
work the graph writes the sum as of its fetch into a row of a ring, a second variable, and as
the work ends (below) that end into the row's place in a third. The loop reads both every
``POLL_S``, not every step, and a step's
fetches are the difference between the rows as of its start and its end (marks on the same
clock): a step's figures wait for the next read, or the phase's end.
A read is an eager op whose cost is TensorFlow's runtime, not the copy: ~100 us of the
loop's time right after a call, and several hundred microseconds of CPU over TensorFlow's
threads. Made once a step it was half of what watching cost an 8 ms step (docs/performance.md).

The end of each step's graph work is clocked too (``GraphClock.ended``, traced after the step's
outputs): what a graph call takes after it is the call's return, and as it returns the loop's
thread must take the GIL back, which loading threads that run Python may hold for a
switch interval (5 ms) or more. The end is kept beside the step's row of the ring, with the
start of the graph that clocked it: the first fetch's first clock op has no inputs, so it runs
as the graph starts. The call's time before that start (its dispatch) and after the end
(its return) is paid once per call, which ``steps_per_execution`` divides.

The clock's ops run on the graph's threads, each costing the executor a few microseconds of a
core the step's own work wants (2 busy cores here): few ops, and few after the work, where each
delays the call's return. The row is written as soon as the step's fetch is clocked, beside
the step's work, so two ops wait for the work to end: the end's clock and its write. With the
row written after the work too (the end's clock, the row, its write), the end of the bench
CNN's call came ~19 us later at 4 ms a step and ~34 us at 9 ms, against ~3-5 now
(bench/watch_keras_call_timeline.py, TensorFlow's profiler; docs/performance.md); the chain of
nine before that cost each call ~60 us more (bench/watch_keras_clock_ab.py --interleave step:
fetch and end clocks +124 us a call, then +59 to +71). The pipeline is untouched. (A ring of
per-fetch rows, read every step, cost ~100 us more in ops and its read ~150 us in Python; the
mark this replaced, appended to the pipeline, ran on the pipeline's thread and cost the bench
CNN ~5 % of its throughput on 2 cores: docs/performance.md.)

A fetch run eagerly (``run_eagerly=True``) is timed in Python instead, on the loop's thread.

Standard library only at import: this runs inside the user's interpreter.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

RING_ROWS = 1024  # step ends kept for the loop's read: POLL_S of steps >= 0.5 ms each
POLL_S = 0.5  # the loop reads the ring at most this often, unless a quarter of it is unread
COLS = 7  # fetches, seconds waited, images, fetches of unknown size, end, start, sequence


class GraphClock:
    """The running sum of clocked fetches, ``(fetches, seconds waited, images, fetches of
    unknown size, -, -, sequence)``, and a ring of rows, one a step: the sum as of the step's
    fetch with the end of its graph work (``tf.timestamp``, the wall clock's seconds: a float64
    holds them to a quarter of a microsecond) and its graph's start, read by the loop now and
    then.

    Args:
        tf: the ``tensorflow`` module.
        on_eager: called with (seconds, element) for a fetch run eagerly on any thread.
    """

    FETCHES = "_stepscope_fetches"  # set on a graph (and those around it) that clocks a fetch
    ENDED = "_stepscope_ended"  # set on a graph (and those around it) whose step end is clocked

    def __init__(self, tf: Any, on_eager: Callable[[float, Any], None]) -> None:
        self.tf = tf
        self.on_eager = on_eager
        self.sums: Any = None
        self.ring: Any = None
        self.step_ends: Any = None  # the end column of the ring, a variable of its own
        self.read: Callable[[], Any] = lambda: _with_ends(self.ring.numpy(),
                                                          self.step_ends.numpy())
        self.lock = threading.Lock()
        # The ring's rows read so far, oldest first (their ends, for bisect), the last one
        # forgotten (the sums as of then), the last sequence number read, and when the last
        # read started (``time.time()``): every step's end before then is in ``rows``.
        self.rows: list[list[float]] = []
        self.ends: list[float] = []
        self.floor = [0.0] * COLS
        self.seen = 0.0
        self.polled_at = 0.0

    def make(self) -> None:
        """Make the variables now (eagerly, before a graph is traced), on the CPU: the clock is
        a host op, and a variable on a GPU would make each read wait for its stream."""
        tf = self.tf
        with self.lock:
            if self.sums is not None:
                return
            with tf.init_scope(), tf.device("/CPU:0"):  # eager, even while tracing
                self.sums = tf.Variable(tf.zeros([COLS], tf.float64), trainable=False,
                                        name="stepscope_fetch_clock")
                self.ring = tf.Variable(tf.zeros([RING_ROWS, COLS], tf.float64),
                                        trainable=False, name="stepscope_fetch_clock_ring")
                self.step_ends = tf.Variable(tf.zeros([RING_ROWS], tf.float64),
                                             trainable=False, name="stepscope_fetch_clock_ends")
                try:  # the bare read op: ~6 us here, where Variable.numpy() took ~18
                    from tensorflow.python.ops import gen_resource_variable_ops as ops

                    handle, ends, dtype = self.ring.handle, self.step_ends.handle, tf.float64
                    ops.read_variable_op(handle, dtype)._numpy()
                    self.read = lambda: _with_ends(ops.read_variable_op(handle, dtype)._numpy(),
                                                   ops.read_variable_op(ends, dtype)._numpy())
                except Exception:  # another TensorFlow: the public read
                    pass

    def clocked(self, fetch: Callable[[], Any], tensors: Callable[[Any], list[Any]],
                images: Callable[[Any], Any]) -> Any:
        """``fetch()`` as traced into a graph, with its wait added to the sum.

        ``tensors(element)``: the tensors the fetch made (the clock stops when all exist);
        ``images(element)``: the batch's size as a float64 tensor, or None when unknown."""
        tf = self.tf
        self.make()
        with tf.device("/CPU:0"):
            t0 = tf.timestamp()
        graph = tf.compat.v1.get_default_graph()
        mark_graphs(graph, self.FETCHES)
        if getattr(graph, "_stepscope_start", None) is None and _called_graph(graph):
            # an op with no inputs runs as the graph starts: the call's start, for ``ended``
            graph._stepscope_start = t0
        with tf.control_dependencies([t0]):
            element = fetch()
        with tf.device("/CPU:0"):
            with tf.control_dependencies(tensors(element)):
                t1 = tf.timestamp()
            n = images(element)
            one = tf.constant(1.0, tf.float64)
            # (1, waited, images or 1 unknown, 1 sequence): the end and start columns are the
            # ring's, not summed; each fetch moves the sequence on, so the step's end need not
            # (few ops: each costs the executor a few microseconds of a core the step wants)
            cols, add = ([0, 1, 3, 6], [one, t1 - t0, one, one]) if n is None \
                else ([0, 1, 2, 6], [one, t1 - t0, n, one])
            added = tf.raw_ops.ResourceScatterAdd(resource=self.sums.handle,
                                                  indices=tf.constant(cols),
                                                  updates=tf.stack(add))
        # the step's end (``ended``) takes the sums as of this fetch, not as of its end
        graph._stepscope_fetched = added
        return element

    def ended(self, outputs: Any) -> None:
        """A step's graph work is done once ``outputs`` (its results, as traced) and every
        stateful op traced before them have run: clock it there. The ring's next row, the sums
        as of the step's fetch, is written beside the work; the end alone after it, in its
        place in ``step_ends``. Nothing outside a graph."""
        tf = self.tf
        if not tf.inside_function():
            return
        self.make()
        deps: list[Any] = [x for x in tf.nest.flatten(outputs) if isinstance(x, tf.Tensor)]
        # The results alone are not the end: a step's metrics need the forward pass only, and
        # the optimizer's updates (most of the work: the backward pass) run beside them. Every
        # stateful op traced so far in this graph is (the updates, the fetch, the counters).
        graph = tf.compat.v1.get_default_graph()
        mark_graphs(graph, self.ENDED)
        deps += [op for op in graph.get_operations() if getattr(op, "_is_stateful", False)]
        start = getattr(graph, "_stepscope_start", None)
        fetched = getattr(graph, "_stepscope_fetched", None)
        handle = self.sums.handle
        with tf.device("/CPU:0"):
            # The sums (and the row's number) are read and the row written as soon as this
            # graph's fetch is clocked, beside the step's work, so that two ops wait for the
            # work to end: the end's clock and its write (see the module's docstring). A
            # graph with no fetch of its own (under ``steps_per_execution`` the branch that runs
            # a step; the fetches are in another) numbers its row and reads the sums after the
            # work, so they count every fetch made by then.
            if fetched is None:
                with tf.control_dependencies(deps):
                    fetched = tf.raw_ops.ResourceScatterAdd(
                        resource=handle, indices=tf.constant(6),
                        updates=tf.constant(1.0, tf.float64))
            with tf.control_dependencies([fetched]):
                sums = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float64)
                at = tf.cast(sums[6], tf.int64) % RING_ROWS
                row = sums if start is None else tf.tensor_scatter_nd_update(
                    sums, tf.constant([[5]]), tf.reshape(start, [1]))
                tf.raw_ops.ResourceScatterUpdate(resource=self.ring.handle, indices=at,
                                                 updates=row)
            with tf.control_dependencies(deps):
                end = tf.timestamp()
            tf.raw_ops.ResourceScatterUpdate(resource=self.step_ends.handle, indices=at,
                                             updates=end)

    def poll(self, pending: int | None = None) -> bool:
        """Read the ring and its ends (an eager op each), keeping the rows not read before.
        With ``pending`` (rows the loop waits for) only when due: ``POLL_S`` after the last
        read, or with a quarter of the ring unread. A read costs the loop ~100 us right after a
        graph call and more after a pause (TensorFlow's runtime gone cold): once a step, it was
        half of what watching cost an 8 ms step (docs/performance.md). Returns whether it
        read: until it does, no step closed since the last read can be settled."""
        at = time.time()
        if self.ring is None:  # not made: no graph has clocked a step
            self.polled_at = at
            return True
        if pending is not None and at - self.polled_at < POLL_S and pending < RING_ROWS // 4:
            return False
        rows = self.read()
        # a row whose end is older than its start is a step still running (a read from
        # another thread): left out, its fetches count in the next row (the sums run on)
        new = rows[(rows[:, 6] > self.seen) & (rows[:, 4] >= rows[:, 5])]
        if len(new):
            got: list[list[float]] = new[new[:, 6].argsort()].tolist()
            self.seen = got[-1][6]
            self.rows += got
            self.ends += [r[4] for r in got]
        self.polled_at = at
        return True

    def between(self, t_from: float, t_to: float) -> tuple[int, float, int, float, float] | None:
        """(fetches, seconds waited, images; -1 when a fetch's size is unknown) clocked by the
        graphs whose work ended after ``t_from`` and by ``t_to``, the latest end by then and
        the start of the graph that clocked it (``time.time()`` seconds; 0 when none yet);
        None until the ring has been read after ``t_to``. Asked in order of ``t_from``: the
        rows before it are forgotten."""
        if self.polled_at < t_to:
            return None
        i = bisect.bisect_right(self.ends, t_from)
        if i:
            self.floor = self.rows[i - 1]
            del self.rows[:i], self.ends[:i]
        j = bisect.bisect_right(self.ends, t_to)
        a, b = self.floor, self.rows[j - 1] if j else self.floor
        fetches, waited, images, unknown = (b[k] - a[k] for k in range(4))
        return round(fetches), waited, -1 if unknown > 0.5 else round(images), b[4], b[5]


def _with_ends(rows: Any, ends: Any) -> Any:
    """The ring's rows with each step's end, kept in a variable of its own, in column 4."""
    rows = rows.copy()
    rows[:, 4] = ends
    return rows


def mark_graphs(graph: Any, attr: str) -> None:
    """Set ``attr`` on ``graph`` and on every graph it is traced inside (a loop's body is
    inside its function's graph)."""
    while graph is not None:
        setattr(graph, attr, True)
        graph = getattr(graph, "outer_graph", None)


def _called_graph(graph: Any) -> bool:
    """Whether ``graph`` is a function's own graph, which starts as the function is called, and
    not a loop's body or a branch (a ``steps_per_execution`` loop's body starts once a batch)."""
    from tensorflow.python.ops import control_flow_v2_func_graphs as flow

    return not isinstance(graph, flow.ControlFlowFuncGraph)


_PROCESS_CLOCK: list[GraphClock] = []


def process_clock(tf: Any, now: Callable[[], float]) -> GraphClock:
    """The process's one fetch clock, installed on tf.data's iterators and on function tracing
    at its first ask: Keras's steps and a hand-written loop read the same ring. Its eager
    fetches go to ``clock.on_eager``, which Keras's steps set (a no-op until then)."""
    if not _PROCESS_CLOCK:
        clock = GraphClock(tf, lambda dt, element: None)
        clock_fetches(tf, clock, now)
        from tensorflow.python.framework import func_graph

        clock_function_ends(tf, func_graph, clock)
        _PROCESS_CLOCK.append(clock)
    return _PROCESS_CLOCK[0]


def clock_function_ends(tf: Any, func_graph: Any, clock: GraphClock) -> None:
    """A function that fetched its own batch as it was traced (an iterator passed into a
    hand-written loop's ``tf.function``, a model's own ``make_train_function``) and whose step
    end nobody clocked (Keras's train functions clock theirs) gets its end clocked once its
    Python has run, so the ring gets a row a call. A loop's body or a branch is left to the
    function around it. Once per process."""
    inner = func_graph.func_graph_from_py_func
    if getattr(inner, "_stepscope", False):
        return
    from tensorflow.python.util import tf_decorator

    def func_graph_from_py_func(name: Any, python_func: Any, *args: Any, **kwargs: Any) -> Any:
        def traced(*a: Any, **k: Any) -> Any:
            out = python_func(*a, **k)
            graph = tf.compat.v1.get_default_graph()
            if getattr(graph, GraphClock.FETCHES, False) \
                    and not getattr(graph, GraphClock.ENDED, False) and _called_graph(graph):
                clock.ended(out)
            return out

        return inner(name, tf_decorator.make_decorator(python_func, traced), *args, **kwargs)

    func_graph_from_py_func._stepscope = True  # type: ignore[attr-defined]
    func_graph.func_graph_from_py_func = func_graph_from_py_func


def clock_fetches(tf: Any, clock: GraphClock, now: Callable[[], float]) -> None:
    """Make every ``tf.data`` iterator's fetch clocked by ``clock``: in a graph by its ops, run
    eagerly by ``now``. Once per process."""
    from tensorflow.python.data.ops import iterator_ops

    cls = iterator_ops.OwnedIterator
    inner_next, inner_optional = cls._next_internal, cls.get_next_as_optional
    if getattr(inner_next, "_stepscope", False):
        return

    def dense(element: Any) -> list[Any]:
        return [x for x in tf.nest.flatten(element) if isinstance(x, tf.Tensor)]

    def batch_size(element: Any) -> Any:
        flat = dense(element)
        if not flat or flat[0].shape.rank == 0:
            return None
        if flat[0].shape.rank is not None and flat[0].shape[0] is not None:
            return tf.constant(float(flat[0].shape[0]), tf.float64)
        if flat[0].shape.rank is not None:  # the first dimension at run time
            return tf.cast(tf.shape(flat[0], out_type=tf.int64)[0], tf.float64)
        # of unknown rank (a numpy_function's output has no static shape): a scalar gives 0
        return tf.cast(tf.reduce_sum(tf.shape(flat[0], out_type=tf.int64)[:1]), tf.float64)

    def _next_internal(self: Any) -> Any:
        if not tf.inside_function():
            t0 = now()
            element = inner_next(self)
            clock.on_eager(now() - t0, element)
            return element
        return clock.clocked(lambda: inner_next(self), dense, batch_size)

    def optional_size(opt: Any) -> Any:
        # The batch's size once the optional's value is there (an empty one, at the end of the
        # data, holds none); None when its structure has no batched tensor.
        specs = [sp for sp in tf.nest.flatten(opt.element_spec) if isinstance(sp, tf.TensorSpec)]
        if not specs or specs[0].shape.rank == 0:
            return None
        return tf.cond(opt.has_value(), lambda: batch_size(opt.get_value()),
                       lambda: tf.constant(0.0, tf.float64))

    def get_next_as_optional(self: Any) -> Any:
        if not tf.inside_function():
            return inner_optional(self)  # an eager caller reads the value: its own op
        return clock.clocked(lambda: inner_optional(self),
                             lambda opt: [opt._variant_tensor], optional_size)

    _next_internal._stepscope = True  # type: ignore[attr-defined]
    cls._next_internal = _next_internal
    cls.get_next_as_optional = get_next_as_optional


# -- Python run by TensorFlow's own threads ------------------------------------------------------
# A ``tf.data`` stage that runs Python (``py_function``/``numpy_function`` maps, and
# ``from_generator``, which Keras's PyDataset and generator adapters use) holds the GIL while it
# runs, and the loop must take the GIL back between its graph calls. Per thread: busy seconds
# and the open call's start (0 when none); each thread writes only its own row.
_py_busy: dict[int, list[float]] = {}
_py_made = [False]  # a py func has been made in this process


def time_py_funcs(script_ops: Any) -> None:
    """Time every Python function TensorFlow runs as an op (``script_ops._internal_py_func``,
    behind ``tf.py_function``, ``tf.numpy_function`` and ``Dataset.from_generator``): two clock
    reads per call. Once per process; a py func made before this is not timed."""
    inner = script_ops._internal_py_func
    if getattr(inner, "_stepscope", False):
        return

    def _internal_py_func(func: Any, *args: Any, **kwargs: Any) -> Any:
        if callable(func):
            _py_made[0] = True
            func = _timed(func)
        return inner(func, *args, **kwargs)

    _internal_py_func._stepscope = True  # type: ignore[attr-defined]
    script_ops._internal_py_func = _internal_py_func


def _timed(func: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        tid = threading.get_ident()
        row = _py_busy.get(tid)
        if row is None:
            row = _py_busy[tid] = [0.0, 0.0]
            _start_gil_probe()
        row[1] = t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            row[0] += time.perf_counter() - t0
            row[1] = 0.0

    timed.__name__ = getattr(func, "__name__", "py_func")
    return timed


def py_funcs_made() -> bool:
    """Whether this process has made a Python op since ``time_py_funcs``."""
    return _py_made[0]


def py_busy_now() -> float:
    """Seconds TensorFlow's threads have spent in Python ops so far, open calls up to now."""
    now = time.perf_counter()
    total = 0.0
    for row in list(_py_busy.values()):
        t0 = row[1]
        total += row[0] + (now - t0 if t0 else 0.0)
    return total


# -- whether that Python holds the GIL -----------------------------------------------------------
# More parallel calls run a Python op side by side only where its Python releases the GIL (NumPy
# on large arrays, OpenCV, PIL's decoders, hashlib do; a Python loop does not): a pipeline of
# such ops, advised "num_parallel_calls", gained 1.00x where 2.2x was predicted. So a probe
# thread, while a Python op runs, sleeps GIL_PROBE_S and times how late it gets back: a thread
# waking to a GIL that Python holds waits up to the switch interval (5 ms) before the holder is
# made to drop it, one waking to a free GIL ~0.1 ms. Its time on a run queue (a busy host) is
# taken out (``/proc/self/task/TID/schedstat``). Late by GIL_LATE_S or more is held: a Python
# loop in a map read late in 88 % of the samples with a tf.function step, 63 % with an eager
# one (whose thread hands the GIL back between its ops), hashing (GIL-free) in 0-1 %.
# Samples are kept per phase kind (the phase open as a sample is taken): a training map of
# Python and a validation map that hashes are two answers. A kind stops at GIL_SAMPLES (6 s or
# more of its Python ops; ~0.2-0.6 ms of CPU a sample), after which the probe only looks every
# GIL_FULL_S whether another kind has begun.
GIL_PROBE_S = 0.02
GIL_LATE_S = 0.001
GIL_SAMPLES = 300
GIL_FULL_S = 0.2
# per phase kind: [samples taken while a Python op ran throughout, those that found the GIL
# held]; none is taken outside a phase
_gil: dict[str, list[int]] = {}
_gil_probe: list[threading.Thread] = []
_gil_phase: list[Callable[[], str | None]] = [lambda: None]


def gil_phase_source(phase_now: Callable[[], str | None]) -> None:
    """Where the probe reads the phase kind open now ("train", "val", None)."""
    _gil_phase[0] = phase_now


def _kind_now() -> str:
    try:
        return _gil_phase[0]() or ""
    except Exception:  # the loop's thread changed its phases under us: outside any
        return ""


def _start_gil_probe() -> None:
    if _gil_probe:
        return
    probe = threading.Thread(target=_probe_gil, name="stepscope-gil-probe", daemon=True)
    _gil_probe.append(probe)
    probe.start()


def _py_op_open() -> bool:
    return any(row[1] for row in list(_py_busy.values()))


def _probe_gil() -> None:
    import os

    try:  # kept open: a /proc file read again from offset 0 is made anew (one syscall a read)
        fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except OSError:
        fd = -1

    def queued() -> float:  # seconds this thread has waited on a run queue
        try:
            return int(os.pread(fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    try:
        while True:
            kind = _kind_now()
            row = _gil.setdefault(kind, [0, 0])
            if row[0] >= GIL_SAMPLES or not kind:  # a full kind, or no phase to give it to
                time.sleep(GIL_FULL_S if kind else GIL_PROBE_S)
                continue
            if not _py_op_open():
                time.sleep(GIL_PROBE_S)
                continue
            q0, t0 = queued(), time.perf_counter()
            time.sleep(GIL_PROBE_S)
            late = time.perf_counter() - t0 - GIL_PROBE_S - (queued() - q0)
            if _py_op_open() and _kind_now() == kind:
                row[0] += 1
                row[1] += late >= GIL_LATE_S
    finally:
        if fd >= 0:
            os.close(fd)


class GilSamples(TypedDict):
    """Fact ``loop.python_gil``: the probe's samples and those that found the GIL held."""

    samples: int
    held: int
    by_phase: dict[str, list[int]]  # phase kind -> [samples, held]


def python_gil() -> GilSamples | None:
    """The probe's samples so far: ``samples`` taken while a Python op ran, ``held`` those that
    found the GIL held, and ``by_phase`` the same per phase kind ({"train": [samples, held]});
    None when no Python op ran."""
    if not _gil_probe:
        return None
    rows = {k: list(v) for k, v in list(_gil.items()) if v[0]}
    return {"samples": sum(v[0] for v in rows.values()),
            "held": sum(v[1] for v in rows.values()), "by_phase": rows}
