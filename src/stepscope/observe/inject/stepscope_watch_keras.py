"""Keras 3 hooks for ``stepscope watch`` (any backend), installed right after ``import keras``.

``Model.fit``/``evaluate``/``predict`` get one more callback. Batch and epoch callbacks are the
step and phase boundaries: ``on_epoch_begin`` opens a train phase, ``on_test_begin`` (inside
``fit`` or from ``evaluate``) a val phase of the current epoch. A step's data wait is the time
from the previous batch's end (or the phase start) to this batch's begin callback, which covers
fetching the batch and Keras's own between-batch work; compute is begin to end callback.
``predict`` is recorded as a val phase (it is inference), with a note.

Keras does not hand callbacks the batch, so images per step come from the call: the number of
samples of ``x`` (arrays, tensors, dicts or lists of them) and ``batch_size`` (32 when not
given, as Keras does); for other inputs a ``batch_size`` attribute; else 0, with a note.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder

ImagesFn = Callable[[int, int], int]


def install(keras: ModuleType, rec: Recorder) -> None:
    """Wrap ``keras.Model.fit``/``evaluate``/``predict`` so every call carries our callback."""
    callback_cls = _callback_class(keras, rec)
    for name in ("fit", "evaluate", "predict"):
        orig = getattr(keras.Model, name)
        setattr(keras.Model, name, _wrap(orig, name, callback_cls, rec))
    try:
        backend = keras.backend.backend()
    except Exception:
        backend = None
    rec.send(["K", backend], urgent=True)


def _num_samples(x: Any) -> int | None:
    if isinstance(x, dict) and x:
        x = next(iter(x.values()))
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        x = x[0]
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    return None


def batch_images(n: int | None, batch_size: int | None) -> ImagesFn:
    """``images(first, last)``: samples in batches ``first..last`` of an epoch over ``n``."""

    def images(first: int, last: int) -> int:
        if batch_size is None:
            return 0
        total = 0
        for i in range(first, last + 1):
            left = batch_size if n is None else n - i * batch_size
            total += max(0, min(batch_size, left))
        return total

    return images


def _loop_sizes(name: str, a: dict[str, Any], rec: Recorder) -> tuple[ImagesFn, ImagesFn]:
    """Images-per-batch functions for the train and the val phases of this call."""
    x = a.get("x")
    n = _num_samples(x)
    bs = a.get("batch_size") or (32 if n is not None else getattr(x, "batch_size", None))
    if bs is None and rec.once("keras-images"):
        rec.note("watch", f"Keras input of type {type(x).__name__}: images per step unknown "
                          "(recorded as 0)")
    if name != "fit":
        return batch_images(n, bs), batch_images(n, bs)
    val_bs = a.get("validation_batch_size") or bs
    split = a.get("validation_split") or 0.0
    val = a.get("validation_data")
    if split and n is not None:
        n_train = int(n * (1.0 - split))
        return batch_images(n_train, bs), batch_images(n - n_train, val_bs)
    val_x = val[0] if isinstance(val, (tuple, list)) and val else val
    n_val = _num_samples(val_x)
    if n_val is None and val_x is not None:
        val_bs = a.get("validation_batch_size") or getattr(val_x, "batch_size", None)
    return batch_images(n, bs), batch_images(n_val, val_bs)


def _wrap(orig: Callable[..., Any], name: str, callback_cls: type, rec: Recorder
          ) -> Callable[..., Any]:
    import inspect  # here, not at start-up: only a Keras program pays for it

    sig = inspect.signature(orig)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # fit() calls evaluate() for validation with its own callback list: ours is in it.
        if rec.framework_depth > 0 or not rec.owner():
            return orig(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
            a = bound.arguments
            train_images, val_images = _loop_sizes(name, a, rec)
            cb = callback_cls(name, train_images, val_images)
            cbs = a.get("callbacks")
            if cbs is None or isinstance(cbs, (list, tuple)):
                a["callbacks"] = [*(cbs or []), cb]
            else:  # a CallbackList
                cbs.append(cb)
            args, kwargs = bound.args[1:], bound.kwargs
        except Exception as exc:
            rec.note("watch", f"Keras {name}() not instrumented: {type(exc).__name__}: {exc}")
        rec.framework_depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            rec.framework_depth -= 1
            rec.cb_phase_end()  # a loop that raised leaves its phase open

    wrapper.__name__ = name
    wrapper.__doc__ = orig.__doc__
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _variables_bytes(variables: Any) -> int:
    import numpy as np  # Keras depends on NumPy

    return sum(_count(v) * np.dtype(str(v.dtype)).itemsize for v in variables)


def _ledger_facts(model: Any, rec: Recorder) -> None:
    """Weights and optimizer state after the first training batch (the optimizer exists now)."""
    try:
        weights = list(model.weights)
        trainable = list(model.trainable_weights)
        rec.fact("mem.weights_bytes", _variables_bytes(weights), "watch: Keras model.weights")
        rec.fact("model.params", sum(_count(v) for v in weights), "watch: Keras model.weights")
        rec.fact("model.trainable_params", sum(_count(v) for v in trainable),
                 "watch: Keras model.trainable_weights")
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            rec.fact("mem.optimizer_bytes", _variables_bytes(optimizer.variables),
                     "watch: Keras optimizer.variables after the first training batch")
    except Exception as exc:  # facts are a nicety; never break the fit
        rec.note("watch", f"Keras memory facts not read: {type(exc).__name__}: {exc}")


def _count(v: Any) -> int:
    count = 1
    for dim in v.shape:
        count *= int(dim)
    return count


def _callback_class(keras: ModuleType, rec: Recorder) -> type:
    base: Any = keras.callbacks.Callback

    class StepscopeWatchCallback(base):
        """Turns Keras loop callbacks into stepscope phases and steps."""

        def __init__(self, call: str, train_images: ImagesFn, val_images: ImagesFn) -> None:
            super().__init__()
            self._call = call
            self._train_images = train_images
            self._val_images = val_images

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            rec.cb_phase_begin("train", self._train_images)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            rec.cb_phase_end()

        def on_test_begin(self, logs: Any = None) -> None:
            rec.cb_phase_begin("val", self._val_images)

        def on_test_end(self, logs: Any = None) -> None:
            rec.cb_phase_end()

        def on_predict_begin(self, logs: Any = None) -> None:
            if rec.once("keras-predict"):
                rec.note("watch", "Keras predict() is recorded as a val phase (inference)")
            rec.cb_phase_begin("val", self._train_images)

        def on_predict_end(self, logs: Any = None) -> None:
            rec.cb_phase_end()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_begin(batch)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_end(batch)
            if rec.once("ledger"):
                _ledger_facts(self.model, rec)

        def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_begin(batch)

        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_end(batch)

        def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_begin(batch)

        def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
            rec.cb_batch_end(batch)

    return StepscopeWatchCallback
