"""Where each Keras backend fetches its batches, instrumented for ``stepscope watch`` (see
``stepscope_watch_keras_steps`` for what is measured on each):

- TensorFlow (Keras 3) and tf-keras: the batch is fetched inside the compiled train function,
  so it is noted where the input pipeline produces it: a Python generator's batches where they
  are yielded, any other ``tf.data`` pipeline's by a mark at its end
  (``stepscope_watch_keras_marks``); the graph calls are timed apart from the step.
- JAX and torch: the trainer pulls each batch with ``next()`` in Python, which is timed.

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_keras_marks import (
        mark_dataset,
        time_generators,
        timed_generator,
    )
    from stepscope.observe.inject.stepscope_watch_keras_steps import (
        KerasSteps,
        TimedIterable,
        time_graph_calls,
    )
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder
else:
    try:  # in the watched interpreter these are top-level modules (see sitecustomize)
        from stepscope_watch_keras_marks import mark_dataset, time_generators, timed_generator
        from stepscope_watch_keras_steps import KerasSteps, TimedIterable, time_graph_calls
    except ImportError:  # in-process, for stepscope.keras.Callback
        from stepscope.observe.inject.stepscope_watch_keras_marks import (
            mark_dataset,
            time_generators,
            timed_generator,
        )
        from stepscope.observe.inject.stepscope_watch_keras_steps import (
            KerasSteps,
            TimedIterable,
            time_graph_calls,
        )


_PATCHED: set[str] = set()


def patch_backend(backend: str | None, rec: Recorder, steps: KerasSteps) -> None:
    """Measure the data wait where ``backend`` fetches its batches (once per process). Works
    until the first epoch starts: the pipelines are marked when their iterator is made."""
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

    cls = trainer.TFEpochIterator
    nxt, get = cls.__next__, cls._get_iterator

    def __next__(self: Any) -> Any:
        out = nxt(self)
        steps.use(id(self), int(self.steps_per_execution or 1))
        return out

    def _get_iterator(self: Any) -> Any:
        steps.new_iterator(id(self))  # before the new iterator starts prefetching
        return _marked(tf, self, get(self), rec, steps)

    cls.__next__, cls._get_iterator = __next__, _get_iterator
    time_generators(tf)
    time_graph_calls(steps)


def _marked(tf: Any, owner: Any, ds: Any, rec: Recorder, steps: KerasSteps) -> Any:
    """``ds`` with its batches noted for ``owner``'s loop: timed where its Python generator
    yields, or else marked (made once per pipeline and kept on ``owner``). Called as each
    iterator is made, so a generator shared by two loops notes for the one iterating."""
    cached = owner.__dict__.get("_stepscope_marked")
    if cached is not None and cached[0] is ds:
        if cached[2] is not None:
            cached[2].attach(steps, id(owner))
        return cached[1]
    timed = None
    if isinstance(ds, tf.data.Dataset):
        timed = timed_generator(ds)
        if timed is not None:
            timed.attach(steps, id(owner))
            marked = ds
        else:
            marked = mark_dataset(tf, ds, steps, id(owner))
    else:
        marked = ds
        if rec.once("keras-distributed"):
            rec.note("watch", "Keras input under a tf.distribute strategy: its data wait is "
                              "not measured (recorded as 0)")
    owner.__dict__["_stepscope_marked"] = (ds, marked, timed)
    return marked


def _patch_tf_keras(rec: Recorder, steps: KerasSteps) -> None:
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    cls = data_adapter.DataHandler
    epochs, each_step = cls.enumerate_epochs, cls.steps

    def enumerate_epochs(self: Any) -> Any:
        # The handler made its dataset before fit's callbacks began: mark it before the first
        # iterator is made from it.
        self._dataset = _marked(tf, self, self._dataset, rec, steps)
        previous = None
        gen = epochs(self)
        while True:
            t0 = steps.clock()  # a new iterator is made after this instant, if one is
            try:
                epoch, iterator = next(gen)
            except StopIteration:
                return
            if iterator is not previous:
                steps.new_iterator(id(self), since=t0)
                previous = iterator
            yield epoch, iterator

    def steps_(self: Any) -> Any:
        for step in each_step(self):
            steps.use(id(self), int(self._step_increment) + 1)
            yield step

    cls.enumerate_epochs = enumerate_epochs
    cls.steps = steps_
    time_generators(tf)
    time_graph_calls(steps)


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

    for make, attr in (("make_train_function", "train_function"),
                       ("make_test_function", "test_function")):
        _keep_function(trainer.JAXTrainer, make, attr, keep)
    steps.device_busy = busy


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


def _time_iterator(cls: type, steps: KerasSteps) -> None:
    get = cls._get_iterator  # type: ignore[attr-defined]

    def _get_iterator(self: Any) -> Any:
        return TimedIterable(get(self), steps)

    cls._get_iterator = _get_iterator  # type: ignore[attr-defined]


# -- fit / evaluate / predict --------------------------------------------------------------------
