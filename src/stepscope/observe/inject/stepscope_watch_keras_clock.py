"""How long a TensorFlow train function waited for its batch, clocked where it waits.

Keras (3 on TensorFlow, and tf-keras) fetches each batch inside its compiled train function:
``iterator.get_next()`` (or ``get_next_as_optional()`` with ``steps_per_execution > 1``) is an op
of the graph, and the graph blocks on it until the input pipeline has a batch. So the wait is
clocked there, the consumer's side, whatever the pipeline is (a Python generator, ``tf.data``
maps, a prefetch buffer): each fetch traced into a graph gets a clock op before it and one after
the batch's tensors, and writes the difference and the batch's size to one row of a small ring
of variables (``GraphClock``). The loop reads the rows once per step, one variable read.

The clock ops run on the graph's own thread, a few microseconds, and the pipeline is untouched:
an earlier mark appended to the pipeline ran on its thread and cost the bench CNN ~5 % of its
throughput on 2 cores (docs/performance.md).

A fetch run eagerly (``run_eagerly=True``) is timed in Python instead, on the loop's thread.

Standard library only at import: this runs inside the user's interpreter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# Rows of the ring: more fetches than this between two reads (``steps_per_execution`` above
# it) are counted short, and said so.
SLOTS = 512


class GraphClock:
    """The ring of fetch rows ``(seq, seconds waited, images)`` and what the loop has read.

    Args:
        tf: the ``tensorflow`` module.
        on_eager: called with (seconds, element) for a fetch run eagerly on any thread.
    """

    def __init__(self, tf: Any, on_eager: Callable[[float, Any], None]) -> None:
        self.tf = tf
        self.on_eager = on_eager
        self.ring: Any = None
        self.count: Any = None
        self.seen = 0  # the last row's seq the loop has read
        self.lost = 0  # rows overwritten before they were read
        self.lock = threading.Lock()

    def make(self) -> None:
        """Make the ring's variables now (eagerly, before a graph is traced), on the CPU: the
        clock is a host op, and a ring on a GPU would make each read wait for its stream."""
        tf = self.tf
        with self.lock:
            if self.ring is not None:
                return
            with tf.init_scope(), tf.device("/CPU:0"):
                self.ring = tf.Variable(tf.zeros([SLOTS, 3], tf.float64), trainable=False,
                                        name="stepscope_fetch_clock")
                self.count = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                         name="stepscope_fetch_count")

    def clocked(self, fetch: Callable[[], Any], tensors: Callable[[Any], list[Any]],
                images: Callable[[Any], Any]) -> Any:
        """``fetch()`` as traced into a graph, with its wait noted in the ring.

        ``tensors(element)``: the tensors the fetch made (the clock stops when all exist);
        ``images(element)``: the batch's size as a float64 tensor (-1: unknown)."""
        tf = self.tf
        self.make()
        with tf.device("/CPU:0"):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            element = fetch()
        with tf.device("/CPU:0"):
            with tf.control_dependencies(tensors(element)):
                t1 = tf.timestamp()
            seq = self.count.assign_add(1)
            row = tf.stack([tf.cast(seq, tf.float64), t1 - t0, images(element)])
            slot = tf.reshape(tf.math.floormod(seq, SLOTS), [1, 1])
            self.ring.scatter_nd_update(slot, tf.reshape(row, [1, 3]))
        return element

    def take(self) -> tuple[int, float, int]:
        """(fetches, seconds waited, images; -1 when a fetch's size is unknown) since the last
        take. One read of the ring, ~20 us here."""
        if self.ring is None:
            return 0, 0.0, 0
        rows = self.ring.numpy()
        with self.lock:
            last = self.seen
            new = [r for r in rows if r[0] > last]
            if not new:
                return 0, 0.0, 0
            top = int(max(r[0] for r in new))
            self.lost += max(0, top - last - len(new))
            self.seen = top
        sizes = [int(r[2]) for r in new]
        images = -1 if any(n < 0 for n in sizes) else sum(sizes)
        return len(new), float(sum(r[1] for r in new)), images


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
        if not flat:
            return tf.constant(-1.0, tf.float64)
        # the first dimension, at run time (a numpy_function's output has no static shape);
        # -1 for a scalar
        shape = tf.concat([tf.shape(flat[0], out_type=tf.int64), tf.constant([-1], tf.int64)], 0)
        return tf.cast(shape[0], tf.float64)

    def _next_internal(self: Any) -> Any:
        if not tf.inside_function():
            t0 = now()
            element = inner_next(self)
            clock.on_eager(now() - t0, element)
            return element
        return clock.clocked(lambda: inner_next(self), dense, batch_size)

    def get_next_as_optional(self: Any) -> Any:
        if not tf.inside_function():
            return inner_optional(self)  # an eager caller reads the value: its own op
        # An optional's size is known only once its value is read: -1, and the loop counts
        # the step's images itself.
        return clock.clocked(lambda: inner_optional(self),
                             lambda opt: [opt._variant_tensor],
                             lambda opt: tf.constant(-1.0, tf.float64))

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
