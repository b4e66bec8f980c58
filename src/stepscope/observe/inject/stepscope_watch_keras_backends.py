"""Where each Keras backend fetches its batches, instrumented for ``stepscope watch`` (see
``stepscope_watch_keras_steps`` for what is measured on each):

- TensorFlow (Keras 3) and tf-keras: the batch is fetched inside the compiled train function,
  so the fetch is clocked there, in the graph (``stepscope_watch_keras_clock``), with the end
  of each step's graph work, and the graph calls are timed apart from the step.
- JAX and torch: the trainer pulls each batch with ``next()`` in Python, which is timed.

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_keras_calls import time_graph_calls
    from stepscope.observe.inject.stepscope_watch_keras_clock import (
        GraphClock,
        process_clock,
        time_py_funcs,
    )
    from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps, TimedIterable
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder
else:
    try:  # in the watched interpreter these are top-level modules (see sitecustomize)
        from stepscope_watch_keras_calls import time_graph_calls
        from stepscope_watch_keras_clock import GraphClock, process_clock, time_py_funcs
        from stepscope_watch_keras_steps import KerasSteps, TimedIterable
    except ImportError:  # in-process, for stepscope.keras.Callback
        from stepscope.observe.inject.stepscope_watch_keras_calls import time_graph_calls
        from stepscope.observe.inject.stepscope_watch_keras_clock import (
            GraphClock,
            process_clock,
            time_py_funcs,
        )
        from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps, TimedIterable


_PATCHED: set[str] = set()


def install_tensorflow() -> None:
    """Right after ``import tensorflow``, before the user builds a pipeline: time the Python
    that TensorFlow's threads will run as ops (``time_py_funcs``)."""
    from tensorflow.python.ops import script_ops

    time_py_funcs(script_ops)


def patch_backend(backend: str | None, rec: Recorder, steps: KerasSteps) -> None:
    """Measure the data wait where ``backend`` fetches its batches (once per process). Works
    for a train function traced after this: on TensorFlow the clock is traced into it."""
    patch = {"tensorflow": _patch_tensorflow, "jax": _patch_jax, "torch": _patch_torch,
             "tf.keras": _patch_tf_keras}.get(str(backend))
    if patch is None or str(backend) in _PATCHED:
        return
    _PATCHED.add(str(backend))
    try:
        patch(rec, steps)
    except Exception as exc:  # an unknown Keras version: steps still come from callbacks
        rec.note("watch", f"Keras {backend} data wait not measured: "
                          f"{type(exc).__name__}: {exc}")


def _patch_tensorflow(rec: Recorder, steps: KerasSteps) -> None:
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    install_tensorflow()
    cls = trainer.TFEpochIterator
    nxt, get = cls.__next__, cls._get_iterator

    def __next__(self: Any) -> Any:
        out = nxt(self)
        steps.use(int(self.steps_per_execution or 1))
        return out

    def _get_iterator(self: Any) -> Any:
        clock.make()  # eagerly, before the train function is traced
        it = get(self)
        _note_unclocked(tf, it, rec)
        return it

    cls.__next__, cls._get_iterator = __next__, _get_iterator
    clock = _clock(tf, steps)
    time_graph_calls(steps)
    _time_epoch_end(steps)
    # Each step's results come out of the (maybe XLA-compiled) one-step function through this
    # wrapper, in the train function's own graph, where a clock op may go.
    convert = trainer.TensorFlowTrainer._autoconvert_optionals

    def _autoconvert_optionals(self: Any, step_func: Any) -> Any:
        return _ends_clocked(convert(self, step_func), clock)

    trainer.TensorFlowTrainer._autoconvert_optionals = _autoconvert_optionals
    make = trainer.TensorFlowTrainer._make_function

    def _make_function(self: Any, step_function: Any) -> Any:
        fn = make(self, step_function)
        fn._stepscope_ends = True  # made under the hook: its step ends will be clocked
        return fn

    trainer.TensorFlowTrainer._make_function = _make_function


def clock_step_ends(model: Any) -> None:
    """Keras 3 on TensorFlow makes a model's train function before ``fit`` calls
    ``on_train_begin``, where ``stepscope.keras.Callback`` installs the hooks: one made before
    has no step-end clock (``GraphClock.ended``), so the clock's ring gets no row and its
    steps would read no data wait. Make it again (it is traced at its first call: an earlier
    ``fit`` that ran it pays one more trace), and forget test and predict functions made
    before, which Keras makes again when it needs them."""
    def made_before(fn: Any) -> bool:
        return fn is not None and not getattr(fn, "_stepscope_ends", False)

    if made_before(model.train_function):
        model.make_train_function(force=True)
    for name in ("test_function", "predict_function"):
        if made_before(getattr(model, name, None)):
            setattr(model, name, None)


def _ends_clocked(fn: Callable[..., Any], clock: GraphClock) -> Callable[..., Any]:
    """``fn``, a step's function traced into a graph, with the end of its work clocked."""
    def step(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        clock.ended(out)
        return out

    return step


def _clock(tf: Any, steps: KerasSteps) -> GraphClock:
    """The process's fetch clock, installed on tf.data's iterators once."""
    if steps.graph_clock is None:
        clock = process_clock(tf, steps.clock)
        clock.on_eager = steps.pulled_batch
        steps.graph_clock = clock
    return steps.graph_clock


def _note_unclocked(tf: Any, source: Any, rec: Recorder) -> None:
    """A Keras input fetched from something else than a ``tf.data`` iterator (a
    ``tf.distribute`` strategy's distributed iterator) has no clock: say so, once."""
    from tensorflow.python.data.ops import iterator_ops

    if isinstance(source, (iterator_ops.OwnedIterator, tf.data.Dataset)):
        return
    if rec.once("keras-distributed"):
        rec.note("watch", "Keras input under a tf.distribute strategy: its data wait is "
                          "not measured (recorded as 0)")


def _patch_tf_keras(rec: Recorder, steps: KerasSteps) -> None:
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    install_tensorflow()
    cls = data_adapter.DataHandler
    epochs, each_step = cls.enumerate_epochs, cls.steps

    def enumerate_epochs(self: Any) -> Any:
        clock.make()  # eagerly, before the train function is traced
        _note_unclocked(tf, self._dataset, rec)
        return epochs(self)

    def steps_(self: Any) -> Any:
        for step in each_step(self):
            steps.use(int(self._step_increment) + 1)
            yield step

    cls.enumerate_epochs = enumerate_epochs
    cls.steps = steps_
    clock = _clock(tf, steps)
    time_graph_calls(steps)
    # tf-keras's train, test and predict step functions end by reducing the replicas' outputs
    # with this module function, in the train function's graph (outside a jit-compiled step).
    from tf_keras.src.engine import training

    training.reduce_per_replica = _ends_clocked(training.reduce_per_replica, clock)


class ReadyClock:
    """Clocks, on a thread of its own, when JAX arrays' results are ready: the loop's thread
    cannot wait for them without holding up what it does meanwhile (pulling the next batch,
    stopping the loader's pool). The wait releases the GIL. One thread for the process, fed a
    leaf at a time (a thread started per pull cost ~0.1 ms).

    Not a daemon: a daemon thread that returns from JAX's wait while the interpreter shuts
    down is ended by ``pthread_exit`` inside C++ frames, which can abort the process (a
    Ctrl-C with a step in flight). This one finishes its wait and leaves once the main thread
    has, checking every ``POLL_S``."""

    POLL_S = 0.2

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.q: queue.SimpleQueue[tuple[Any, list[float]]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.last: tuple[Any, Callable[[], float | None]] | None = None

    def watch(self, leaf: Any) -> Callable[[], float | None]:
        """Start waiting for ``leaf``; the getter returns when it was ready (None: not yet).
        The same leaf is waited for once: the step a loop closes is the one its next pull
        may find still computing."""
        if self.last is not None and self.last[0] is leaf:
            return self.last[1]
        if self.thread is None or not self.thread.is_alive():  # a forked child has none
            self.thread = threading.Thread(target=self._run, name="stepscope-device-wait")
            self.thread.start()
        at: list[float] = []
        self.q.put((leaf, at))

        def ready() -> float | None:
            return at[0] if at else None

        self.last = (leaf, ready)
        return ready

    def _run(self) -> None:
        main = threading.main_thread()
        while main.is_alive():
            try:
                leaf, at = self.q.get(timeout=self.POLL_S)
            except queue.Empty:
                continue
            try:
                leaf.block_until_ready()
            except Exception:  # a failed step: its error is the loop's to raise
                continue
            at.append(self.clock())


def _patch_jax(rec: Recorder, steps: KerasSteps) -> None:
    import jax
    from keras.src.backend.jax import trainer

    _time_iterator(trainer.JAXEpochIterator, steps)
    pending: list[Any] = []  # one leaf of the last dispatched step's logs

    def busy() -> bool:
        leaf = pending[0] if pending else None
        ready = getattr(leaf, "is_ready", None)
        return ready is not None and not ready()

    def keep(fn: Any) -> Any:
        def step(state: Any, data: Any) -> Any:
            out = fn(state, data)
            leaves = jax.tree_util.tree_leaves(out[0])  # the logs: a few scalars
            pending[:] = leaves[:1]
            return out

        step._stepscope = True  # type: ignore[attr-defined]
        return step

    waiter = ReadyClock(steps.clock)

    def done() -> Callable[[], float | None]:
        return waiter.watch(pending[0])

    for make, attr in (("make_train_function", "train_function"),
                       ("make_test_function", "test_function")):
        _keep_function(trainer.JAXTrainer, make, attr, keep)
    steps.device_busy = busy
    steps.device_done = done
    _time_epoch_end(steps)


def _keep_function(cls: Any, make: str, attr: str, keep: Callable[[Any], Any]) -> None:
    orig = getattr(cls, make)

    def wrapper(self: Any, force: bool = False) -> Any:
        out = orig(self, force)
        fn = getattr(self, attr, None)
        if fn is not None and not getattr(fn, "_stepscope", False):
            setattr(self, attr, keep(fn))
        return out

    setattr(cls, make, wrapper)


def _patch_torch(rec: Recorder, steps: KerasSteps) -> None:
    from keras.src.backend.torch import trainer

    steps.pull_cuts = True
    _time_iterator(trainer.TorchEpochIterator, steps)
    _time_epoch_end(steps)


def _time_epoch_end(steps: KerasSteps) -> None:
    """End the epoch's last step where Keras 3 ends a PyDataset's epoch on the loop's thread:
    it stops a worker pool (~0.85 s for two processes here) and runs the dataset's own
    ``on_epoch_end``, once an epoch, not in a step. Once per process, every Keras 3 backend."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    inner = PyDatasetAdapter.on_epoch_end
    if getattr(inner, "_stepscope", False):
        return

    def on_epoch_end(self: Any) -> Any:
        steps.epoch_ending(steps.clock())
        return inner(self)

    on_epoch_end._stepscope = True  # type: ignore[attr-defined]
    PyDatasetAdapter.on_epoch_end = on_epoch_end


def _time_iterator(cls: type, steps: KerasSteps) -> None:
    get = cls._get_iterator  # type: ignore[attr-defined]

    def _get_iterator(self: Any) -> Any:
        return TimedIterable(get(self), steps)

    cls._get_iterator = _get_iterator  # type: ignore[attr-defined]


# -- fit / evaluate / predict --------------------------------------------------------------------
