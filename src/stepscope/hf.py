"""``stepscope.hf.Callback``: record a Hugging Face ``Trainer.train()`` into a run directory.

Examples:
    >>> from transformers import Trainer
    >>> import stepscope.hf
    >>> trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
    ...                   callbacks=[stepscope.hf.Callback(out="runs/mine")])
    >>> trainer.train()                                 # then: runs/mine/report.html

How the ``Trainer``'s loop maps onto steps (transformers 4.4x-5.x):

- A step is one optimizer step (``on_step_begin`` .. ``on_step_end``). The ``Trainer`` fetches
  all of a step's micro-batches (``gradient_accumulation_steps`` of them) *before*
  ``on_step_begin``, so the data wait is the time from the previous step's end (or the epoch's
  start, which includes creating the DataLoader iterator) to ``on_step_begin``; it also holds
  the Trainer's own logging after the previous step. A checkpoint (``save_steps``) is written
  after its step and announced by ``on_save``: the time from the step's end (or the
  evaluation's, when one ran first) to ``on_save`` is a checkpoint write
  (``trainer/checkpoint_write_s``), not the next step's wait. Compute is
  ``on_step_begin`` .. ``on_step_end``: forward, backward and optimizer. The copy to the device
  happens inside ``training_step`` and so counts as compute.
- Validation: the Trainer has no callback before an evaluation or before each evaluation batch,
  so while recording, ``Trainer.evaluation_loop`` and ``Trainer.prediction_step`` are wrapped
  (and unwrapped at the end): the loop opens and closes a val phase, ``prediction_step``'s entry
  is the batch's arrival, ``on_prediction_step`` its end. An evaluation inside an epoch
  (``eval_strategy="steps"``) ends that epoch's train phase: the epoch's later steps are not
  recorded (a note says so).
- Images per step are counted from the micro-batches ``training_step``/``prediction_step``
  receive (the first tensor's length, e.g. ``pixel_values`` or ``input_ids``).

Importing this module needs nothing but stepscope; using :class:`Callback` needs ``transformers``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepscope.errors import StepscopeError

_CLASS: list[type] = []
_WRAPPED = ("evaluation_loop", "prediction_step", "training_step")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise StepscopeError("stepscope.hf.Callback needs transformers: pip install "
                             "transformers accelerate") from exc
    return transformers


class _TrainerWraps:
    """The Trainer methods wrapped while one callback records (restored afterwards)."""

    def __init__(self, trainer_cls: type, owner: Any, images: list[int]) -> None:
        self._cls = trainer_cls
        self._owner = owner
        self._images = images
        # free-form: the Trainer methods it wraps, by name, to put back
        self._saved: dict[str, Any] = {}

    def _ours(self, trainer: Any) -> bool:
        handler = getattr(trainer, "callback_handler", None)
        return self._owner in getattr(handler, "callbacks", ())

    def install(self) -> None:
        for name in _WRAPPED:
            orig = self._cls.__dict__.get(name)
            if orig is not None:
                self._saved[name] = orig
                setattr(self._cls, name, getattr(self, f"_wrap_{name}")(orig))

    def remove(self) -> None:
        for name, orig in self._saved.items():
            setattr(self._cls, name, orig)
        self._saved.clear()

    def _wrap_evaluation_loop(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        from stepscope.observe.callbacks import ACTIVE

        @functools.wraps(orig)
        def evaluation_loop(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._ours(trainer):
                return orig(trainer, *args, **kwargs)
            if ACTIVE.cb_phase is not None and ACTIVE.cb_phase.phase == "train" \
                    and ACTIVE.once("hf-eval-in-epoch"):
                self._owner.owner.note("an evaluation inside an epoch ended its train phase: "
                                       "that epoch's later training steps are not recorded")
            ACTIVE.cb_phase_begin("val", lambda first, last: 0)
            try:
                return orig(trainer, *args, **kwargs)
            finally:
                ACTIVE.cb_phase_end()

        return evaluation_loop

    def _wrap_prediction_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        from stepscope.observe.callbacks import ACTIVE
        from stepscope.observe.inject.stepscope_watch_recorder import count_images

        @functools.wraps(orig)
        def prediction_step(trainer: Any, model: Any, inputs: Any, *args: Any,
                            **kwargs: Any) -> Any:
            if self._ours(trainer):
                ACTIVE.cb_batch_begin(0)  # the batch has arrived: its wait ends here
                self._images[1] = count_images(inputs)
            return orig(trainer, model, inputs, *args, **kwargs)

        return prediction_step

    def _wrap_training_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        from stepscope.observe.inject.stepscope_watch_recorder import count_images

        @functools.wraps(orig)
        def training_step(trainer: Any, model: Any, inputs: Any, *args: Any,
                          **kwargs: Any) -> Any:
            if self._ours(trainer):
                self._images[0] += count_images(inputs)
            return orig(trainer, model, inputs, *args, **kwargs)

        return training_step


def _callback_class() -> type:
    transformers = _transformers()
    from stepscope._adapter import RunOwner
    from stepscope.observe.callbacks import ACTIVE

    base: Any = transformers.TrainerCallback

    class Callback(base):
        """Records ``Trainer.train()`` into ``out`` (run.db, then summary.json, report.html).

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
            self.owner = RunOwner(out, "hf", name=name, dataset_files=dataset_files,
                                  interval_s=interval_s, tensorboard=tensorboard, quiet=quiet)
            self._images = [0, 0]  # images of the open train step, of the open val step
            self._wraps = _TrainerWraps(transformers.Trainer, self, self._images)

        @property
        def result(self) -> Any:
            """The finished run (summary, answers, report path) once training has ended."""
            return self.owner.result

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.is_world_process_zero and self.owner.begin():
                self._wraps.install()
                # its fixes name TrainingArguments (analysis/vocab.py)
                ACTIVE.fact("loop.framework", "transformers", "stepscope.hf.Callback in "
                            "Trainer.train")

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._wraps.remove()
            self.owner.end("completed")

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ACTIVE.cb_phase_begin("train", lambda first, last: 0)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ACTIVE.cb_phase_end()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._images[0] = 0
            ACTIVE.cb_batch_begin(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            images = self._images[0] or args.train_batch_size * args.gradient_accumulation_steps
            ACTIVE.cb_batch_end(state.global_step, images)

        def on_prediction_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ACTIVE.cb_batch_end(0, self._images[1])

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ACTIVE.cb_saved()

    Callback.__module__ = __name__
    Callback.__qualname__ = "Callback"
    return Callback


def __getattr__(name: str) -> Any:
    if name == "Callback":
        if not _CLASS:
            _CLASS.append(_callback_class())
        return _CLASS[0]
    raise AttributeError(name)
