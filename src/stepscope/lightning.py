"""``stepscope.lightning.Callback``: record a Lightning ``Trainer.fit`` into a run directory.

Examples:
    >>> import lightning as L
    >>> import stepscope.lightning
    >>> trainer = L.Trainer(max_epochs=3, callbacks=[stepscope.lightning.Callback(out="runs/mine")])
    >>> trainer.fit(model, train_loader, val_loader)   # then: runs/mine/report.html

The steps and phases come from the same Lightning hooks ``stepscope watch`` installs
(``observe/inject/stepscope_watch_lightning.py``): a train epoch start opens a train phase, a
validation epoch start a val phase (sanity-check validation is not recorded); a step's data wait
runs from the previous batch's end to the start of ``transfer_batch_to_device`` (which Lightning
runs after fetching the batch, before ``on_*_batch_start``), the time in that hook is the step's
transfer, and compute runs from batch start to batch end. At the end of ``fit`` the run directory gets
``summary.json`` and ``report.html``, as after ``watch``.

Importing this module needs nothing but stepscope; using :class:`Callback` needs Lightning
(``lightning.pytorch`` or ``pytorch_lightning``, whichever the program imported).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from stepscope.errors import StepscopeError

_CLASSES: dict[str, type] = {}


def _lightning() -> ModuleType:
    """The Lightning package the program uses: its Trainer accepts only its own Callbacks."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if sys.modules.get(name) is not None:
            return sys.modules[name]
    try:
        import lightning.pytorch as pl

        return pl
    except ImportError:
        try:
            import pytorch_lightning

            return pytorch_lightning
        except ImportError as exc:
            raise StepscopeError("stepscope.lightning.Callback needs Lightning; found neither "
                                 "lightning nor pytorch_lightning: pip install lightning") from exc


def _callback_class(pl: ModuleType) -> type:
    from stepscope._adapter import RunOwner
    from stepscope.observe.callbacks import ACTIVE
    from stepscope.observe.inject import stepscope_watch_lightning as hooks
    from stepscope.observe.inject.stepscope_watch_recorder import count_images

    base: Any = hooks._callback_class(pl, ACTIVE, count_images)
    hooks._time_batch_transfer(pl, ACTIVE)  # a callback cannot see the copy; this hook does

    class Callback(base):
        """Records ``Trainer.fit`` into ``out`` (run.db, then summary.json and report.html).

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
            super().__init__()
            self.owner = RunOwner(out, "lightning", name=name, dataset_files=dataset_files,
                                  interval_s=interval_s, tensorboard=tensorboard, quiet=quiet)

        @property
        def result(self) -> Any:
            """The finished run (summary, answers, report path) once fit has ended."""
            return self.owner.result

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            # Under DDP every rank runs the callbacks; rank 0 records (one run directory).
            if getattr(trainer, "global_rank", 0) == 0 and self.owner.begin():
                # its precision, checkpoints and logging are Trainer arguments (analysis/vocab.py)
                ACTIVE.fact("loop.framework", "lightning", "stepscope.lightning.Callback in "
                            "Trainer.fit")

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.owner.end("completed")

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            interrupted = isinstance(exception, (KeyboardInterrupt, SystemExit))
            self.owner.end("interrupted" if interrupted else "failed")

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            self.owner.end("completed")

    Callback.__module__ = __name__
    Callback.__qualname__ = "Callback"
    return Callback


def __getattr__(name: str) -> Any:
    # Built on first use, over the Lightning package the program imported.
    if name == "Callback":
        pl = _lightning()
        if pl.__name__ not in _CLASSES:
            _CLASSES[pl.__name__] = _callback_class(pl)
        return _CLASSES[pl.__name__]
    raise AttributeError(name)
