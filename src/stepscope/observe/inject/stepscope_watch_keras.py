"""Keras hooks for ``stepscope watch``: Keras 3 (any backend) and tf-keras (``tf.keras`` with
``TF_USE_LEGACY_KERAS=1``), installed right after ``import keras`` / ``import tf_keras``.

``Model.fit``/``evaluate``/``predict`` get one more callback, whose epoch and test hooks are the
phase boundaries (``on_epoch_begin`` opens a train phase, ``on_test_begin`` a val phase of the
current epoch; ``predict`` is recorded as a val phase, with a note) and whose batch-begin hooks
cut the steps. The data wait is measured where each backend fetches its batch (see
``stepscope_watch_keras_steps``). The callback is ``async_safe`` and has no batch-end hook, so
Keras keeps its asynchronous callbacks and watching adds no device sync per batch (on JAX the
steps' results are waited for on a thread of stepscope's: ``KerasSteps._record``).

What loads the data is recorded as facts (``loader.*``): the input kind (PyDataset, generator,
tf.data, arrays), PyDataset workers and multiprocessing, tf.data parallel calls, prefetch and
cache, and whether an ImageDataGenerator augments. The advice reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_keras_backends import patch_backend
    from stepscope.observe.inject.stepscope_watch_keras_clock import py_funcs_made
    from stepscope.observe.inject.stepscope_watch_keras_data import (
        augment_layers,
        describe_input,
        loop_sizes,
    )
    from stepscope.observe.inject.stepscope_watch_keras_memory import (
        cache_fact,
        count_of,
        ledger_facts,
        mark_jax_start,
        mark_rss,
        refit_growth,
        runtime_baseline,
    )
    from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps, gil_clocks
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder
else:
    try:  # in the watched interpreter these are top-level modules (see sitecustomize)
        from stepscope_watch_keras_backends import patch_backend
        from stepscope_watch_keras_clock import py_funcs_made
        from stepscope_watch_keras_data import augment_layers, describe_input, loop_sizes
        from stepscope_watch_keras_memory import (
            cache_fact,
            count_of,
            ledger_facts,
            mark_jax_start,
            mark_rss,
            refit_growth,
            runtime_baseline,
        )
        from stepscope_watch_keras_steps import KerasSteps, gil_clocks
    except ImportError:  # in-process, for stepscope.keras.Callback
        from stepscope.observe.inject.stepscope_watch_keras_backends import patch_backend
        from stepscope.observe.inject.stepscope_watch_keras_clock import py_funcs_made
        from stepscope.observe.inject.stepscope_watch_keras_data import (
            augment_layers,
            describe_input,
            loop_sizes,
        )
        from stepscope.observe.inject.stepscope_watch_keras_memory import (
            cache_fact,
            count_of,
            ledger_facts,
            mark_jax_start,
            mark_rss,
            refit_growth,
            runtime_baseline,
        )
        from stepscope.observe.inject.stepscope_watch_keras_steps import KerasSteps, gil_clocks


def install(keras: ModuleType, rec: Recorder, count_images: Callable[[Any], int]) -> None:
    """Keras 3: wrap ``Model.fit``/``evaluate``/``predict`` and the backend's batch source."""
    runtime_baseline(rec, "Keras 3 and its backend")
    steps = keras_steps(rec, count_images)
    try:
        backend = keras.backend.backend()
    except Exception:
        backend = None
    if backend == "jax":
        mark_jax_start(rec)
    _wrap_model(keras.Model, keras.callbacks.Callback, rec, steps, "keras")
    rec.send(["K", backend], urgent=True)
    rec.fact("loop.framework", "keras", "watch: the script called Keras 3's Model.fit/evaluate")
    rec.fact("loop.keras_backend", backend, "watch: keras.backend.backend()")
    patch_backend(backend, rec, steps)
    _time_pool_workers(rec, "keras.src.trainers.data_adapters.py_dataset_adapter", count_images)


def _time_pool_workers(rec: Recorder, module_name: str,
                       count_images: Callable[[Any], int]) -> None:
    """Each PyDataset worker process's busy time (see ``install_pool_workers``)."""
    import importlib

    kstages = _kstages()
    try:
        found = kstages.install_pool_workers(importlib.import_module(module_name),
                                             count_images)
    except Exception as exc:  # another Keras layout: the workers' CPU is still sampled
        found, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = "no get_index"
    if not found:
        rec.note("watch", f"Keras worker processes' busy time not measured ({why})")


_STEPS: dict[int, KerasSteps] = {}


def keras_steps(rec: Recorder, count_images: Callable[[Any], int]) -> KerasSteps:
    """The one step-window keeper of ``rec`` (shared by watch's hook and stepscope.keras)."""
    steps = _STEPS.get(id(rec))
    if steps is None:
        steps = _STEPS[id(rec)] = KerasSteps(rec, count_images)
    return steps


def install_tf_keras(tf_keras: ModuleType, rec: Recorder,
                     count_images: Callable[[Any], int]) -> None:
    """tf-keras (Keras 2 on TensorFlow): the same callback, batches marked in its DataHandler."""
    runtime_baseline(rec, "tf-keras and TensorFlow")
    steps = keras_steps(rec, count_images)
    _wrap_model(tf_keras.Model, tf_keras.callbacks.Callback, rec, steps, "tf.keras")
    rec.send(["K", "tensorflow"], urgent=True)
    rec.fact("loop.framework", "tf.keras", "watch: the script called tf-keras's Model.fit/evaluate")
    rec.fact("loop.keras_backend", "tensorflow", "watch: tf-keras runs on TensorFlow")
    patch_backend("tf.keras", rec, steps)
    _time_pool_workers(rec, "tf_keras.src.utils.data_utils", count_images)


def _kstages() -> ModuleType:
    if TYPE_CHECKING:
        from stepscope.observe.inject import stepscope_watch_keras_stages as kstages
    else:
        try:
            import stepscope_watch_keras_stages as kstages
        except ImportError:
            from stepscope.observe.inject import stepscope_watch_keras_stages as kstages
    return kstages


def install_image_stages(module: ModuleType, rec: Recorder,
                         count_images: Callable[[Any], int]) -> None:
    """Time ImageDataGenerator's load / transform / preprocess stages (Keras 3 legacy or
    tf-keras module); the counters are read at each phase boundary."""
    kstages = _kstages()
    steps = keras_steps(rec, count_images)
    if steps.stages is None:
        steps.stages = kstages.LoaderStages(steps.clock)
        steps.stages_delta = kstages.delta
    kstages.install(module, steps.stages)


# -- where each backend fetches its batch ------------------------------------------------------
def _wrap_model(model_cls: Any, callback_base: Any, rec: Recorder, steps: KerasSteps,
                framework: str) -> None:
    callback_cls = callback_class(callback_base, rec, steps)
    for name in ("fit", "evaluate", "predict"):
        orig = getattr(model_cls, name)
        setattr(model_cls, name, _wrap(orig, name, callback_cls, rec, steps, framework))
    for name in ("save", "save_weights"):  # ModelCheckpoint's writes, and the script's own
        if (orig := getattr(model_cls, name, None)) is not None:
            setattr(model_cls, name, rec.timed_save(orig))


def _checkpoint_fact(callbacks: Any, rec: Recorder) -> None:
    """How the user's ``ModelCheckpoint`` saves, for advice that leaves out what it does."""
    for cb in callbacks:
        if type(cb).__name__ == "ModelCheckpoint" and rec.once("keras-model-checkpoint"):
            rec.fact("loop.keras_model_checkpoint",
                     {"save_best_only": bool(getattr(cb, "save_best_only", False)),
                      "save_weights_only": bool(getattr(cb, "save_weights_only", False))},
                     "watch: the ModelCheckpoint given to Model.fit")


def _watch_gil(steps: KerasSteps, train_in: dict[str, object], rec: Recorder) -> None:
    """Loading that runs Python in this process beside the loop: count the loop thread's time
    off its CPU outside the graph's work and its pulls, up to the loading's busy time in the
    step, as data wait (see ``stepscope_watch_keras_steps``). On TensorFlow (its graph calls
    timed) that is a PyDataset, Sequence or generator not on worker processes (Keras runs them
    through ``Dataset.from_generator``, whose Python runs on tf.data's threads, and a
    PyDataset's ``workers`` on a thread pool). On JAX and torch a PyDataset's worker threads
    (``workers > 1``; with one worker the loop runs ``__getitem__`` itself, inside the timed
    ``next()``). On every backend, a ``tf.data`` pipeline once any Python op has been made (its
    ``py_function``/``numpy_function`` maps)."""
    kind = train_in.get("kind")
    in_process = kind in ("PyDataset", "ImageDataGenerator", "generator") \
        and not train_in.get("multiprocessing")
    if steps.train_calls is None:  # JAX, torch: only a thread pool runs beside the loop
        workers = train_in.get("workers")
        in_process = in_process and kind != "generator" and isinstance(workers, int) \
            and workers > 1
    if not (in_process or (kind == "tf.data" and py_funcs_made())):
        steps.off_cpu = steps.loader_busy = None
        return
    steps.off_cpu, steps.loader_busy = gil_clocks(steps.clock)
    if rec.once("keras-gil-wait"):
        rec.fact("loop.keras_gil_wait", True,
                 "watch: the loading runs Python in the training process, so "
                 "the loop thread's time off its CPU outside the graph's work (clocked in the "
                 "graph from its start to each step's end), its timed next() and the user's "
                 "callbacks, up to the loading's busy time in the step (PyDataset worker "
                 "threads, Python ops on tf.data's threads), is counted as data wait: it waits "
                 "for the GIL or a core the loading holds")


def _wrap(orig: Callable[..., Any], name: str, callback_cls: type, rec: Recorder,
          steps: KerasSteps, framework: str) -> Callable[..., Any]:
    import inspect  # here, not at start-up: only a Keras program pays for it

    sig = inspect.signature(orig)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # fit() calls evaluate() for validation with its own callback list: ours is in it.
        if rec.framework_depth > 0 or not rec.owner():
            return orig(self, *args, **kwargs)
        initial_epoch = 0
        try:
            bound = sig.bind(self, *args, **kwargs)
            a = bound.arguments
            initial_epoch = int(a.get("initial_epoch") or 0)
            train_images, val_images = loop_sizes(name, a, rec)
            train_in = describe_input(a.get("x"), a, rec, framework, "train")
            val_in = describe_input(_val_x(a), a, rec, framework, "val") if name == "fit" \
                else train_in
            cb = callback_cls(name, train_images, val_images, train_in.get("workers"),
                              val_in.get("workers"),
                              {"train": train_in.get("cache_bytes_per_image"),
                               "val": val_in.get("cache_bytes_per_image")})
            _watch_gil(steps, train_in, rec)
            cbs = a.get("callbacks")
            if cbs is None or isinstance(cbs, (list, tuple)):
                a["callbacks"] = [*(cbs or []), cb]
            else:  # a CallbackList
                cbs.append(cb)
            _time_user_callbacks(getattr(cbs, "callbacks", cbs) or [], callback_cls, steps)
            _checkpoint_fact(getattr(cbs, "callbacks", cbs) or [], rec)
            if rec.once("keras-callbacks-timed"):
                rec.fact("loop.keras_callbacks_timed", True,
                         "watch: the user's on_train_batch_begin/_end callbacks timed on the "
                         "loop's thread (the steps' other_s)")
            args, kwargs = bound.args[1:], bound.kwargs
            if rec.once("keras-strategy"):
                _strategy_facts(self, rec)
        except Exception as exc:
            rec.note("watch", f"Keras {name}() not instrumented: {type(exc).__name__}: {exc}")
        fresh = _warm_new_functions(self, name, rec)
        if name == "fit":
            _fit_trainable(self, initial_epoch, rec)
            if (found := augment_layers(self)) is not None and rec.once("keras-augment-layers"):
                rec.fact("model.augment_layers", found,
                         "watch: the model's random preprocessing layers (Keras runs them in "
                         "training steps only), read at the first fit()")
            if "train" in fresh and "first_step" in rec.rss_marks:  # a later fit compiles again
                mark_rss(rec, "refit")
        mark_rss(rec, "fit")
        rec.framework_depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            rec.framework_depth -= 1
            steps.phase_end()  # a loop that raised leaves its phase open

    wrapper.__name__ = name
    wrapper.__doc__ = orig.__doc__
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


# The step function each call runs, and the phase its steps are recorded in. compile() drops
# them (a fine-tuning script recompiles after unfreezing its base); the call that makes one again
# traces it in its first step: ~17 s for MobileNetV2's backward pass on this CPU (a graph, no
# XLA: Keras turns it off without an accelerator), where its steps took 55 ms, so the new
# function's first phase starts with warm-up steps, as the first fit's.
_STEP_FUNCTIONS = {"fit": (("train_function", "train"), ("test_function", "val")),
                   "evaluate": (("test_function", "val"),),
                   "predict": (("predict_function", "val"),)}


_FITS: dict[int, list[list[int]]] = {}  # per recorder: [first epoch, trainable params] a fit


def _fit_trainable(model: Any, initial_epoch: int, rec: Recorder) -> None:
    """Each outer ``fit``'s first epoch and trainable parameter count, the list so far as fact
    ``model.trainable_by_fit``: the fine-tuning guide freezes its base for a first fit and
    unfreezes it for a second, where frozen-trunk advice no longer holds."""
    try:
        if not getattr(model, "built", False):  # its weights do not exist yet
            return
        n = sum(count_of(v) for v in model.trainable_weights)
    except Exception:
        return
    fits = _FITS.setdefault(id(rec), [])
    fits.append([max(rec.epoch + 1, initial_epoch + 1), n])
    if len(fits) > 1:
        rec.fact("model.trainable_by_fit", fits,
                 "watch: Keras model.trainable_weights at each fit() call, with the fit's "
                 "first epoch")


def _warm_new_functions(model: Any, name: str, rec: Recorder) -> tuple[str, ...]:
    """The phases whose step function this call makes anew (warmed up again), returned."""
    fresh = tuple(phase for attr, phase in _STEP_FUNCTIONS[name]
                  if getattr(model, attr, "unknown") is None)
    rec.warm_again(fresh)
    return fresh


def _strategy_facts(model: Any, rec: Recorder) -> None:
    """The ``tf.distribute`` strategy the model runs under, when it is not the default one
    (TensorFlow backends only: Keras 3 on JAX or torch has no ``distribute_strategy``). Under
    a strategy the input is a distributed dataset, whose data wait is not measured."""
    strategy = getattr(model, "distribute_strategy", None)
    name = type(strategy).__name__
    if strategy is None or name.startswith("_Default"):
        return
    how = "watch: the Keras model's distribute_strategy at fit/evaluate/predict"
    rec.fact("loop.distribute_strategy", name, how)
    replicas = getattr(strategy, "num_replicas_in_sync", None)
    if isinstance(replicas, int):
        rec.fact("loop.distribute_replicas", replicas, how + " (num_replicas_in_sync)")


_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end")


def _time_user_callbacks(callbacks: Any, ours: type, steps: KerasSteps) -> None:
    """Time the batch hooks the user's callbacks override (per instance, once each). Keras runs
    a callback that is not ``async_safe`` on the loop's thread between steps: what it costs
    there is overhead that ``steps_per_execution`` divides. Two clock reads per hook call; no
    device sync (the logs are whatever Keras hands the callback)."""
    clock, base = steps.clock, ours.__bases__[0]
    for cb in callbacks:
        if isinstance(cb, ours):
            continue
        for name in _BATCH_HOOKS:
            hook = getattr(type(cb), name, None)
            if hook is None or hook is getattr(base, name, None) or name in cb.__dict__:
                continue  # Keras's no-op default, or already timed (or set by the user)
            bound = getattr(cb, name)

            def timed(*args: Any, _hook: Any = bound, _name: str = type(cb).__name__,
                      **kwargs: Any) -> Any:
                t0 = clock()
                try:
                    return _hook(*args, **kwargs)
                finally:
                    steps.callback_ran(clock() - t0, _name)

            setattr(cb, name, timed)


# free-form: the keyword arguments of the user's fit()/evaluate() call
def _val_x(a: dict[str, Any]) -> Any:
    val = a.get("validation_data")
    if isinstance(val, (tuple, list)) and val:
        return val[0]
    return val


def callback_class(base: Any, rec: Recorder, steps: KerasSteps) -> type:
    """The callback class over Keras's ``base`` (``keras.callbacks.Callback``), driving ``steps``.
    """
    class StepscopeWatchCallback(base):
        """Turns Keras loop callbacks into stepscope phases; steps are cut at batch begins."""

        # No batch-end hook and async-safe: Keras keeps dispatching batch-end callbacks
        # asynchronously (Keras 3) and hands tf-keras callbacks tensors, not numbers, so
        # watching adds no device sync per batch.
        async_safe = True
        _supports_tf_logs = True

        def __init__(self, call: str, train_images: Any, val_images: Any,
                     train_workers: int | None, val_workers: int | None,
                     cached: dict[str, int | None] | None = None) -> None:
            super().__init__()
            self._call = call
            self._train_images, self._val_images = train_images, val_images
            self._train_workers, self._val_workers = train_workers, val_workers
            # bytes an image takes in each phase's in-memory tf.data cache, where there is one
            self._cached = cached or {}

        def _end(self) -> None:
            ph = steps.phase_end()
            held = self._cached.get(ph.phase) if ph is not None else None
            if ph is not None and held and ph.images and rec.once(f"tf-data-cache-{ph.phase}"):
                # the first pass fills the cache: each image it took, as the cache holds it
                cache_fact(rec, ph.phase, ph.images * held)
            if ph is not None and ph.phase == "train":
                if "refit" in rec.rss_marks and "first_step" in rec.rss_marks:
                    refit_growth(rec)  # a later fit's epoch of one step
                mark_rss(rec, "first_step")  # an epoch of one step
            if ph is not None and ph.phase == "train" and rec.once("ledger"):
                ledger_facts(self.model, rec)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            # numbered as Keras prints it: a fit resumed with initial_epoch=5 opens "Epoch 6/10"
            steps.phase_begin("train", self._train_images, self._train_workers, epoch + 1)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._end()

        def on_test_begin(self, logs: Any = None) -> None:
            self._end()
            steps.phase_begin("val", self._val_images, self._val_workers)

        def on_test_end(self, logs: Any = None) -> None:
            self._end()

        def on_predict_begin(self, logs: Any = None) -> None:
            if rec.once("keras-predict"):
                rec.note("watch", "Keras predict() is recorded as a val phase (inference)")
            steps.phase_begin("val", self._train_images, self._train_workers)

        def on_predict_end(self, logs: Any = None) -> None:
            self._end()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            steps.batch_begin(batch)
            if batch > 0 and "first_step" not in rec.rss_marks:
                mark_rss(rec, "first_step")
            elif batch > 0 and "refit" in rec.rss_marks:
                refit_growth(rec)

        def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
            steps.batch_begin(batch)

        def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
            steps.batch_begin(batch)

    return StepscopeWatchCallback

