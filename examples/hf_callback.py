"""Hugging Face Trainer + stepscope: one callback, and the run explains itself at the end.

    python examples/hf_callback.py --out runs/hf --epochs 2 --load-ms 20

The model is a tiny image classifier defined here (no download); any model the ``Trainer``
accepts works the same. ``--load-ms`` makes every sample take that long to load (a stand-in for
slow decoding or a slow disk), so the run is input-bound and stepscope should say so.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

import stepscope.hf


class Shapes(Dataset):
    """Random 3x32x32 images with a label, as the dicts a Trainer expects."""

    def __init__(self, n: int, load_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0).long()
        self.load_s = load_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.load_s:
            time.sleep(self.load_s)
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, 2))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/hf")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--images", type=int, default=160)
    ap.add_argument("--load-ms", type=float, default=20.0)
    ap.add_argument("--save-steps", type=int, default=0,
                    help="write a checkpoint every N steps (the Trainer's default is 500)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        targs = TrainingArguments(
            output_dir=scratch, num_train_epochs=args.epochs, per_device_train_batch_size=8,
            per_device_eval_batch_size=8, eval_strategy="epoch",
            save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
            logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=TinyNet(), args=targs,
            train_dataset=Shapes(args.images, args.load_ms / 1000),
            eval_dataset=Shapes(args.images // 4, 0.0),
            callbacks=[stepscope.hf.Callback(out=args.out)],
        )
        trainer.train()


if __name__ == "__main__":
    main()
