"""``stepscope predict``: class and probability for each image, from a trainer checkpoint.

Every image gets its own answer: a class and its probability, or the reason that one file could
not be read. One bad file never hides the answers for the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

from stepscope.errors import DataError, ModelError
from stepscope.train import augment, checkpoint, data, models


class PredictionJson(TypedDict):
    """One image's answer as ``predict --json`` prints it."""

    path: str
    label: str | None
    probability: float | None
    error: str | None


@dataclass
class Prediction:
    """One image's answer: ``label`` and ``probability``, or the ``error`` that stopped it."""

    path: Path
    label: str | None = None
    probability: float | None = None
    error: str | None = None

    def to_dict(self) -> PredictionJson:
        return {"path": str(self.path), "label": self.label, "probability": self.probability,
                "error": self.error}


def predict(ckpt_path: Path, images: list[Path]) -> list[Prediction]:
    """Classify ``images`` with the model saved in ``ckpt_path``, one answer per image.

    Raises:
        ModelError: the checkpoint is missing, unreadable, tampered with or not stepscope's.

    Examples:
        >>> predict(Path("runs/demo/checkpoints/best.pt"), [Path("cat.1.jpg")])[0].label
        'cat'
    """
    state = checkpoint.load_checkpoint(ckpt_path)
    cfg, classes = state.get("config", {}), list(state.get("classes", []))
    if len(classes) < 2:
        raise ModelError(f"{ckpt_path} does not list its classes: was it written by stepscope train?")
    if not isinstance(cfg, dict):
        raise ModelError(f"{ckpt_path} holds no training configuration: was it written by stepscope train?")
    model = models.create_model(str(cfg.get("model", "efficientnet_lite0")), weights="none",
                                num_classes=len(classes), unfreeze=int(cfg.get("unfreeze", 0)))
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{ckpt_path}: its weights do not fit its own model {cfg.get('model')!r} "
                         f"({first}); the file was altered or comes from elsewhere") from exc
    model.eval()
    tf = augment.create_transform(None, int(cfg.get("img_size", 299)), train=False)
    return [_one(model, tf, classes, path) for path in images]


def _one(model: Any, tf: Any, classes: list[str], path: Path) -> Prediction:
    if not path.is_file():
        return Prediction(path, error="not found (expected an image file)")
    try:
        x = tf(path).unsqueeze(0)
    except data.CorruptImageError as exc:
        return Prediction(path, error=f"cannot decode: {exc.reason}")
    except DataError as exc:
        return Prediction(path, error=str(exc))
    with torch.no_grad():
        probs = model.predict_proba(model(x))[0]
    k = int(probs.argmax())
    return Prediction(path, classes[k], float(probs[k]))
