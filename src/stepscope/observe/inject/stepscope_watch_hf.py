"""Hugging Face hooks for ``stepscope watch``: a script's ``Trainer`` watched with no stepscope
code. Its loop is a PyTorch loop (the torch hooks time its steps); these add what the Trainer
does around it:

- ``Trainer.train`` says the loop is the Trainer's (fact ``loop.framework``): its DataLoaders,
  precision and checkpoints are set through ``TrainingArguments``, so the advice names those;
- ``Trainer._save_checkpoint`` is one checkpoint write: the model's safetensors file and the
  optimizer's, scheduler's and RNG states' ``torch.save`` inside it are part of it
  (``Recorder.timed_save`` nests);
- ``safetensors.torch.save_file``/``save_model``: a script's own safetensors checkpoints.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder


def install_trainer(module: ModuleType, rec: Recorder) -> None:
    """Patch ``transformers.trainer.Trainer`` in place."""
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return
    if (save := getattr(trainer, "_save_checkpoint", None)) is not None:
        trainer._save_checkpoint = rec.timed_save(save)
    train = trainer.train

    @functools.wraps(train)
    def timed_train(*args: Any, **kwargs: Any) -> Any:
        if rec.owner() and rec.once("hf-trainer"):
            rec.fact("loop.framework", "transformers", "watch: the script called transformers' "
                     "Trainer.train")
        return train(*args, **kwargs)

    trainer.train = timed_train


def install_safetensors(module: ModuleType, rec: Recorder) -> None:
    """Time ``safetensors.torch``'s writes as checkpoint writes."""
    for name in ("save_file", "save_model"):
        if (save := getattr(module, name, None)) is not None:
            setattr(module, name, rec.timed_save(save))
