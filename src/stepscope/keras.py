"""``stepscope.keras.Callback``: record ``model.fit`` into a run directory, on any Keras backend.

Examples:
    >>> import keras
    >>> import stepscope.keras
    >>> model.fit(x, y, epochs=3, validation_data=(xv, yv),
    ...           callbacks=[stepscope.keras.Callback(out="runs/mine")])   # then: report.html

This is ``stepscope watch``'s Keras hook (``observe/inject/stepscope_watch_keras.py``) offered as
a callback: the same callback class, the same rules for what a step's data wait and compute
include on each backend, the same count of images per batch (from the arguments of the ``fit``
call it is passed to). What ``watch`` records from a Keras script and what this callback records
from the same script are the same records. At the end of ``fit`` the run directory gets
``summary.json`` and ``report.html``.

Importing this module needs nothing but stepscope; using :class:`Callback` needs Keras 3 (or
``tf.keras`` with ``TF_USE_LEGACY_KERAS=1``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from stepscope.errors import StepscopeError

_CLASSES: dict[str, type] = {}


def _keras() -> ModuleType:
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1" or "tf_keras" in sys.modules:
        try:
            import tf_keras

            return tf_keras
        except ImportError:
            pass
    try:
        import keras

        return keras
    except ImportError as exc:
        raise StepscopeError("stepscope.keras.Callback needs Keras: pip install keras "
                             "(and a backend: tensorflow, jax or torch)") from exc


# free-form: the keyword arguments Keras's fit() was called with
def _fit_arguments(model: Any) -> dict[str, Any] | None:
    """The arguments of the ``fit`` call running ``model`` (the frame up the stack): callbacks
    are not handed the data, and the images per batch come from them, as under ``watch``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            args = dict(frame.f_locals)
            if args.get("validation_data") is not None:
                # fit() has already cut x into train and validation when validation_split is set.
                args["validation_split"] = 0.0
            return args
        frame = frame.f_back
    return None


def _callback_class(keras: ModuleType) -> type:
    from stepscope._adapter import RunOwner
    from stepscope.observe.callbacks import ACTIVE
    from stepscope.observe.inject import stepscope_watch_keras as hooks
    from stepscope.observe.inject import stepscope_watch_keras_backends as backends
    from stepscope.observe.inject import stepscope_watch_keras_data as data
    from stepscope.observe.inject.stepscope_watch_recorder import count_images

    steps = hooks.keras_steps(ACTIVE, count_images)
    base: Any = hooks.callback_class(keras.callbacks.Callback, ACTIVE, steps)
    legacy = keras.__name__ == "tf_keras"

    def no_images(first: int, last: int) -> int:
        return 0

    class Callback(base):
        """Records ``model.fit`` into ``out`` (run.db, then summary.json and report.html).

        Args:
            out: the run directory, e.g. ``"runs/mine"``.
            name: the run's name (default: the folder's name).
            dataset_files: the dataset's files, for page-cache residency (optional).
            interval_s: sampling period of the system samplers, seconds.
            tensorboard: also write TensorBoard event files to this folder at the end.
            quiet: print nothing at the end.
        """

        def __init__(self, out: str | Path, *, name: str | None = None,
                     dataset_files: Sequence[str | Path] = (), interval_s: float = 1.0,
                     tensorboard: str | Path | None = None, quiet: bool = False) -> None:
            super().__init__("fit", no_images, no_images, None, None)
            self.owner = RunOwner(out, "keras", name=name, dataset_files=dataset_files,
                                  interval_s=interval_s, tensorboard=tensorboard, quiet=quiet)

        @property
        def result(self) -> Any:
            """The finished run (summary, answers, report path) once fit has ended."""
            return self.owner.result

        def on_train_begin(self, logs: Any = None) -> None:
            if not self.owner.begin():
                return
            try:
                backend = "tensorflow" if legacy else keras.backend.backend()
            except Exception:
                backend = None
            ACTIVE.send(["K", backend], urgent=True)
            framework = "tf.keras" if legacy else "keras"
            ACTIVE.fact("loop.framework", framework, "stepscope.keras.Callback in Model.fit")
            ACTIVE.fact("loop.keras_backend", backend, "keras.backend.backend()")
            # Before the first epoch: the batch source is instrumented as under watch.
            hooks.patch_backend(framework if legacy else backend, ACTIVE, steps)
            if backend == "tensorflow" and not legacy:
                backends.clock_step_ends(self.model)
            args = _fit_arguments(self.model)
            if args is None:
                self.owner.note("the fit() call's arguments were not found: images per step "
                                "unknown (recorded as 0)")
                return
            self._train_images, self._val_images = data.loop_sizes("fit", args, ACTIVE)
            self._train_workers = data.describe_input(args.get("x"), args, ACTIVE, framework,
                                                      "train").get("workers")
            val = args.get("validation_data")
            val_x = val[0] if isinstance(val, (tuple, list)) and val else val
            self._val_workers = data.describe_input(val_x, args, ACTIVE, framework,
                                                    "val").get("workers")

        def on_train_end(self, logs: Any = None) -> None:
            steps.phase_end()
            self.owner.end("completed")

    Callback.__module__ = __name__
    Callback.__qualname__ = "Callback"
    return Callback


def __getattr__(name: str) -> Any:
    if name == "Callback":
        keras = _keras()
        if keras.__name__ not in _CLASSES:
            _CLASSES[keras.__name__] = _callback_class(keras)
        return _CLASSES[keras.__name__]
    raise AttributeError(name)
