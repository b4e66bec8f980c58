"""``stepscope predict``: class and probability for images, from a trainer checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from stepscope.errors import DataError
from stepscope.train import augment, checkpoint, data, models


@dataclass
class Prediction:
    path: Path
    label: str
    probability: float


def predict(ckpt_path: Path, images: list[Path]) -> list[Prediction]:
    """Classify ``images`` with the model saved in ``ckpt_path``.

    Examples:
        >>> predict(Path("runs/demo/checkpoints/best.pt"), [Path("cat.1.jpg")])[0].label
        'cat'
    """
    state = checkpoint.load_checkpoint(ckpt_path)
    cfg, classes = state.get("config", {}), list(state.get("classes", []))
    if len(classes) < 2:
        raise DataError(f"{ckpt_path} does not list its classes: was it written by stepscope train?")
    model = models.create_model(cfg.get("model", "efficientnet_lite0"), weights="none",
                                num_classes=len(classes), unfreeze=int(cfg.get("unfreeze", 0)))
    model.load_state_dict(state["model"])
    model.eval()
    tf = augment.create_transform(None, int(cfg.get("img_size", 299)), train=False)
    out = []
    for path in images:
        if not path.is_file():
            raise DataError(f"image {path} not found")
        try:
            x = tf(path).unsqueeze(0)
        except data.CorruptImageError as exc:
            raise DataError(f"{path} could not be decoded as an image: {exc}") from exc
        with torch.no_grad():
            probs = model.predict_proba(model(x))[0]
        k = int(probs.argmax())
        out.append(Prediction(path, classes[k], float(probs[k])))
    return out
