"""Where a Keras/TensorFlow loop's batches are noted for ``stepscope watch``: when each was
asked for and when it was ready, which ``KerasSteps`` turns into each step's data wait.

- A pipeline fed by a Python generator (``Dataset.from_generator``: Keras's PyDataset and
  generator adapters, tf-keras's Sequence and generator adapters, ImageDataGenerator) and
  ending in nothing but ``prefetch``/options is timed in Python where the generator yields
  (``TimedGenerator``): two clock reads in a thread that already holds the GIL.
- Any other pipeline gets one step appended to its end (``mark_dataset``) that notes each batch
  in a file the loop reads (``MarkLog``). That step is TensorFlow ops on the pipeline's thread;
  after a Python generator it cost the bench CNN ~5 % of its throughput (2 cores, both busy
  computing), so it is kept for the pipelines the generator clock cannot see into.

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol


class Steps(Protocol):
    """What the notes need of ``KerasSteps``: its clock and where the notes go."""

    clock: Callable[[], float]
    mark_log: MarkLog | None
    count_images: Callable[[Any], int]

    def batch_ready(self, token: int, images: int, requested: float,
                    ready: float | None = None) -> None: ...


class TimedGenerator:
    """The generator function of a ``Dataset.from_generator``, with each batch timed where it is
    yielded: asked for when tf.data called ``next`` (the prefetch thread, or the train
    function's own request without a prefetch), ready when it came back.

    Notes go to the last ``attach``-ed loop, under its token; before any, nothing is noted. The
    batch still crosses tf.data's conversion to tensors and its prefetch buffer after this
    clock: a copy of the batch, far shorter than the loading it follows.
    """

    def __init__(self, generator: Callable[..., Any]) -> None:
        self.generator = generator
        self.steps: Steps | None = None
        self.token = 0

    def attach(self, steps: Steps, token: int) -> None:
        self.steps, self.token = steps, token

    def __call__(self, *args: Any) -> Any:
        it = iter(self.generator(*args))
        try:
            while True:
                steps = self.steps
                requested = steps.clock() if steps is not None else 0.0
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if steps is not None:
                    try:
                        steps.batch_ready(self.token, steps.count_images(batch), requested,
                                          steps.clock())
                    except Exception:  # a batch we cannot count: never break the user's loop
                        self.steps = None
                yield batch
        finally:
            # tf.data drops the generator at the end of an iteration: close the user's with it
            # (PyDataset's enqueuer stops its workers in a ``finally``).
            close = getattr(it, "close", None)
            if close is not None:
                close()


def time_generators(tf: Any) -> None:
    """Make every later ``tf.data.Dataset.from_generator`` time its generator
    (``TimedGenerator``, found again with ``timed_generator``). Once per process."""
    cls = tf.data.Dataset
    inner = cls.from_generator
    if getattr(inner, "_stepscope", False):
        return

    def from_generator(generator: Any, *args: Any, **kwargs: Any) -> Any:
        timed = TimedGenerator(generator) if callable(generator) else None
        ds = inner(generator if timed is None else timed, *args, **kwargs)
        if timed is not None:
            with contextlib.suppress(AttributeError, TypeError):
                ds._stepscope_timed = timed
        return ds

    from_generator._stepscope = True  # type: ignore[attr-defined]
    from_generator.__doc__ = inner.__doc__
    cls.from_generator = staticmethod(from_generator)


# Stages between a generator and the loop that hand its batches on unchanged.
_PASS_THROUGH = ("_PrefetchDataset", "_OptionsDataset")


def timed_generator(dataset: Any) -> TimedGenerator | None:
    """The ``TimedGenerator`` whose batches ``dataset`` hands on unchanged, if any: a
    ``from_generator`` dataset behind nothing but prefetches and options."""
    while type(dataset).__name__ in _PASS_THROUGH:
        dataset = getattr(dataset, "_input_dataset", None)
    timed = getattr(dataset, "_stepscope_timed", None)
    return timed if isinstance(timed, TimedGenerator) else None


def mark_dataset(tf: Any, dataset: Any, steps: Steps, token: int) -> Any:
    """``dataset`` with a last step that tells ``steps`` when each batch was asked for and when
    it left the pipeline.

    The request time comes from a clock zipped in front of the batch: ``zip`` asks its inputs
    in turn when its own consumer asks, so the clock element is made at the request. This
    matters for the first batch of an iterator: tf.data starts producing on the first request,
    which a traced train function makes only after tracing, so the batch-begin callback is not
    when the batch was asked for. Both clocks are ``tf.timestamp`` (a TensorFlow op); the note
    is one ``tf.print`` line per batch to a file the loop reads (:class:`MarkLog`), joined to
    the batch by a control dependency so the batch cannot reach the train function before it is
    written. Structure, dtypes and static shapes of the batch are unchanged.

    A pipeline that ends in ``prefetch`` (Keras's PyDataset adapter, the tf.data guide's own
    pipelines) is marked *inside* that prefetch: ``inner.prefetch(n)`` becomes
    ``mark(inner).prefetch(n)``. Appended after it, the mark's ``map`` would be a synchronous
    last stage, and tf.data's ``inject_prefetch`` (on by default) would put a second prefetch
    buffer after it that the unwatched run does not have, and the watched run ran faster than
    the bare one (docs/performance.md). Inside the prefetch the batch is noted when
    it enters the buffer, asked for when the buffer's thread asked: the wait is still
    ``ready - max(begin, request)``, zero when the buffer held the batch.
    """

    # Both clocks are TensorFlow ops (no Python, no GIL): Unix microseconds, turned into this
    # process's monotonic clock when the loop reads the note.
    log = steps.mark_log
    if log is None:
        log = steps.mark_log = MarkLog(time.time() - steps.clock())
    stream = f"file://{log.path}"

    clock = _inline_map(tf, tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat(),
                        lambda _: tf.timestamp())

    def mark(requested: Any, structure: Any) -> Any:
        flat = tf.nest.flatten(structure)
        dense = [x for x in flat if isinstance(x, tf.Tensor)]
        if not dense:
            return structure
        first = dense[0]
        n = tf.shape(first, out_type=tf.int64)[0] if first.shape.rank else tf.constant(1, tf.int64)
        done = tf.print(tf.constant(token, tf.int64), _micros(tf, requested),
                        _micros(tf, tf.timestamp()), n, output_stream=stream)
        with tf.control_dependencies([done]):
            out = [tf.identity(x) if isinstance(x, tf.Tensor) else x for x in flat]
        return tf.nest.pack_sequence_as(structure, out)

    ends_in_prefetch = _prefetch_parts(dataset)
    inner = dataset if ends_in_prefetch is None else ends_in_prefetch[0]
    marked = _inline_map(tf, tf.data.Dataset.zip((clock, inner)), mark)
    return marked if ends_in_prefetch is None else marked.prefetch(ends_in_prefetch[1])


def _micros(tf: Any, seconds: Any) -> Any:
    return tf.cast(seconds * 1e6, tf.int64)


class MarkLog:
    """The marks' notes: one line per batch, ``token requested_us ready_us images``, appended by
    TensorFlow's print op to a file of this process and read by the loop's thread at each step.

    The op opens, appends and closes the file for each line, in C++ on the pipeline's thread:
    no Python and no GIL, ~30 us a batch here, where a ``tf.numpy_function`` note cost ~100 us
    and waited for the GIL behind any Python loading threads. A line is read once complete (a
    read can catch one half-written). Past ``ROTATE_BYTES`` the file is unlinked: a line being
    written still lands in the open inode, which is drained for ``ROTATE_GRACE_S`` more, and
    the next line makes a new file at the path. Lines of one pipeline come in order: its mark
    runs on one thread at a time, each line closed before the next is opened.
    """

    ROTATE_BYTES = 1 << 20
    ROTATE_GRACE_S = 1.0

    def __init__(self, offset: float) -> None:
        self.offset = offset  # Unix time less the loop's clock
        folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        fd, self.path = tempfile.mkstemp(prefix=f"stepscope-marks-{os.getpid()}-", dir=folder)
        os.close(fd)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.size = 0
        self.old: list[tuple[int, float]] = []  # unlinked files still drained: (fd, until)
        self.partial = b""
        self.lock = threading.Lock()
        self.pid = os.getpid()
        atexit.register(self.close)

    def read(self) -> list[tuple[int, int, int, int]]:
        with self.lock:
            chunks = [self._drain(fd) for fd, _ in self.old]
            now = time.monotonic()
            for fd, _ in [o for o in self.old if o[1] < now]:
                os.close(fd)
            self.old = [o for o in self.old if o[1] >= now]
            new = self._drain(self.fd)
            self.size += len(new)
            chunks.append(new)
            if self.size > self.ROTATE_BYTES:
                self._rotate(now)
            data = self.partial + b"".join(chunks)
            cut = data.rfind(b"\n") + 1
            self.partial = data[cut:]
        out = []
        for line in data[:cut].splitlines():
            f = line.split()
            if len(f) == 4:
                out.append((int(f[0]), int(f[1]), int(f[2]), int(f[3])))
        return out

    @staticmethod
    def _drain(fd: int) -> bytes:
        parts: list[bytes] = []
        while True:
            got = os.read(fd, 1 << 16)
            if not got:
                return b"".join(parts)
            parts.append(got)

    def _rotate(self, now: float) -> None:
        try:
            os.unlink(self.path)
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o600)
        except OSError:
            return
        self.old.append((self.fd, now + self.ROTATE_GRACE_S))
        self.fd, self.size = fd, 0

    def close(self) -> None:
        if os.getpid() != self.pid:  # a forked child exiting: the file is its parent's
            return
        with self.lock, contextlib.suppress(OSError):
            os.unlink(self.path)


def _inline_map(tf: Any, dataset: Any, fn: Callable[..., Any]) -> Any:
    """``dataset.map(fn)`` with ``fn``'s ops run on the thread that asks for the element.

    A map whose function holds a stateful op (the clock, the note) is not optimised away, and
    by default each call hands the function's ops to TensorFlow's inter-op thread pool: about
    150 us of CPU per batch on this machine for a lone ``tf.timestamp``, a third of what the
    mark cost in all (``bench/watch_keras_step_cost.py``). Run inline, as tf.data's own
    ``use_inter_op_parallelism=False`` does, that hand-off is gone (within noise). The option
    is not in ``Dataset.map``'s public signature: another TensorFlow falls back to ``map``.
    """
    try:
        from tensorflow.python.data.ops import map_op

        return map_op._MapDataset(dataset, fn, use_inter_op_parallelism=False)
    except (ImportError, AttributeError, TypeError):
        return dataset.map(fn)


def _prefetch_parts(dataset: Any) -> tuple[Any, Any] | None:
    """``(inner, buffer_size)`` when ``dataset`` is ``inner.prefetch(buffer_size)``."""
    if type(dataset).__name__ != "_PrefetchDataset":
        return None
    inner = getattr(dataset, "_input_dataset", None)
    try:  # a tensor; prefetch() wants the number (-1 is AUTOTUNE) to choose its autotuning
        size = int(dataset._buffer_size)
    except (AttributeError, TypeError, ValueError):  # graph mode, another TensorFlow
        return None
    return None if inner is None else (inner, size)
