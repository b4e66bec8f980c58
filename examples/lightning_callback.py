"""Lightning + stepscope: one callback, and the run explains itself at the end of fit.

    python examples/lightning_callback.py --out runs/lightning --epochs 2 --load-ms 20

``--load-ms`` makes every sample take that long to load (a stand-in for slow decoding or a
slow disk), so the run is input-bound and stepscope should say so.
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import stepscope.lightning


class Shapes(Dataset):
    """Random 3x32x32 images with a label; ``load_s`` per item stands for decoding."""

    def __init__(self, n: int, load_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = (self.x.mean(dim=(1, 2, 3)) > 0).long()
        self.load_s = load_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.load_s:
            time.sleep(self.load_s)
        return self.x[i], self.y[i]


class TinyNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, 2))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/lightning")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--images", type=int, default=160)
    ap.add_argument("--load-ms", type=float, default=20.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    train = DataLoader(Shapes(args.images, args.load_ms / 1000), batch_size=8, shuffle=True)
    val = DataLoader(Shapes(args.images // 4, 0.0), batch_size=8)
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[stepscope.lightning.Callback(out=args.out)],
    )
    trainer.fit(TinyNet(), train, val)


if __name__ == "__main__":
    main()
