"""Lightning hooks for ``stepscope watch``, installed after ``lightning.pytorch`` or
``pytorch_lightning`` is imported (tested with Lightning 2.6, tests/watch_scripts/
lightning_val_interval.py); every step is guarded so a mismatch costs the step timing, never
the run.

``Trainer.__init__`` gets one more callback; ``Trainer.fit``/``validate``/``test``/``predict``
mark a framework loop, so the plain-PyTorch DataLoader and optimizer hooks stand aside while
Lightning's own hooks time the steps: train epoch start opens a train phase, validation epoch
start a val phase of the current epoch (sanity-check validation is not recorded). Validation
after the epoch's last training batch closes the train phase; validation in the middle of it
(``val_check_interval < 1``) is nested: the train phase stays open and its steps resume after.
Data wait runs from the previous batch end (or the validation's end) to the batch-start hook,
compute from batch start to batch end. Lightning moves the batch to the device before the
batch-start hook (the strategy's ``batch_to_device`` runs the LightningModule's
``transfer_batch_to_device`` hook, the user's override included): that hook is timed and booked
as the step's transfer, and the data wait ends where it began. On a GPU a blocking copy also
waits there for queued work, which then counts as transfer, not data wait.

The memory ledger is the torch hooks' (``stepscope_watch_torch``), measured by the same rules:
Lightning's optimizer step is a ``torch.optim`` step, whose global post-hook sends weights,
gradients and optimizer state at the first one, inside Lightning's loop too. Two things Lightning
hides from those hooks come from here: the model (the LightningModule being fit; Lightning sets
``.training`` itself instead of calling ``Module.train``) and each training batch's arrival at
the batch-start hook (its DataLoader is not timed inside the loop), where saved-for-backward
counting and the step peak's VmHWM reset begin, as at a plain loop's batch arrival, and where
the torch hooks start reading the precision (``Trainer(precision="bf16-mixed")`` enters autocast
around ``training_step``, after this hook) and the batch's layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder


def install(pl: ModuleType, rec: Recorder, count_images: Callable[[Any], int]) -> None:
    """Patch a Lightning package (``lightning.pytorch`` or ``pytorch_lightning``)."""
    trainer_cls = pl.Trainer
    callback = _callback_class(pl, rec, count_images)
    orig_init = trainer_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cbs = kwargs.get("callbacks")
        if cbs is None:
            kwargs["callbacks"] = [callback()]
        elif isinstance(cbs, (list, tuple)):
            kwargs["callbacks"] = [*cbs, callback()]
        else:
            kwargs["callbacks"] = [cbs, callback()]
        orig_init(self, *args, **kwargs)

    trainer_cls.__init__ = __init__
    _time_batch_transfer(pl, rec)
    for name in ("fit", "validate", "test", "predict"):
        orig = getattr(trainer_cls, name, None)
        if orig is not None:
            setattr(trainer_cls, name, _framework_loop(orig, rec))
    # ModelCheckpoint's writes: serialised by torch.save into memory, then written to the file
    # (lightning.fabric's _atomic_save), so the whole write is timed here, not in torch.save
    if (save := getattr(trainer_cls, "save_checkpoint", None)) is not None:
        trainer_cls.save_checkpoint = rec.timed_save(save)


def _framework_loop(orig: Callable[..., Any], rec: Recorder) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if rec.owner() and rec.once("lightning"):
            # its precision is a Trainer argument: the advice names it (analysis/findings.py)
            rec.fact("loop.framework", "lightning", "watch: the script called Lightning's "
                     f"Trainer.{wrapper.__name__}")
        rec.framework_depth += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            rec.framework_depth -= 1
            rec.cb_phase_end()

    wrapper.__name__ = getattr(orig, "__name__", "loop")
    return wrapper


def _time_batch_transfer(pl: ModuleType, rec: Recorder) -> None:
    """Time ``transfer_batch_to_device`` where Lightning calls it: ``_call_batch_hook`` (2.x)
    dispatches it to the module's (or the datamodule's) override. Other batch hooks
    (``on_after_batch_transfer``: GPU augmentation) are not copies and stay in the step."""
    module_cls = getattr(pl, "LightningModule", None)
    orig = getattr(module_cls, "_call_batch_hook", None)
    if module_cls is None or orig is None:
        return

    def _call_batch_hook(self: Any, hook_name: str, *args: Any) -> Any:
        if hook_name != "transfer_batch_to_device" or not rec.owner():
            return orig(self, hook_name, *args)
        t0 = rec.clock()
        out = orig(self, hook_name, *args)
        rec.cb_transfer(t0, rec.clock() - t0)
        return out

    module_cls._call_batch_hook = _call_batch_hook


def _callback_class(pl: ModuleType, rec: Recorder, count_images: Callable[[Any], int]) -> type:
    def no_images(first: int, last: int) -> int:
        return 0

    base: Any = pl.Callback

    class StepscopeWatchLightningCallback(base):
        """Turns Lightning loop hooks into stepscope phases and steps."""

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            # Lightning sets ``.training`` itself, never calling the outermost Module.train that
            # finds the model for the plain loop: without this the ledger's weights would be the
            # optimizer's parameters only (no buffers, no frozen layers).
            with contextlib.suppress(TypeError):  # not weak-referenceable
                rec.roots.add(pl_module)

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            rec.cb_phase_begin("train", no_images)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            rec.cb_phase_end()

        def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.nested = False
            if getattr(trainer, "sanity_checking", False):
                return
            fitting = str(getattr(getattr(trainer, "state", None), "fn", "")) in ("fit", "TrainerFn.FITTING")
            if fitting and not _epoch_done(trainer):
                self.nested = True
                rec.cb_nested_begin("val", no_images)
            else:
                rec.cb_phase_begin("val", no_images)

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if getattr(trainer, "sanity_checking", False):
                return
            if self.nested:
                rec.cb_nested_end()
            else:
                rec.cb_phase_end()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                 batch_idx: int) -> None:
            # before the step's forward (and its autocast): the ledger's first step, the precision
            rec.train_batch_arrived(batch)
            rec.cb_batch_begin(batch_idx)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            rec.cb_batch_end(batch_idx, count_images(batch))

        def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                      batch_idx: int, dataloader_idx: int = 0) -> None:
            rec.cb_batch_begin(batch_idx)

        def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                                    batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            rec.cb_batch_end(batch_idx, count_images(batch))

    return StepscopeWatchLightningCallback


def _epoch_done(trainer: Any) -> bool:
    """Has the training epoch run its last batch (validation at the epoch's end)?"""
    try:
        loop = trainer.fit_loop.epoch_loop
        return bool(loop._num_ready_batches_reached())
    except Exception:  # another Lightning version: treat validation as the epoch's end
        return True
