"""A LightningModule as Lightning's docs write it, its precision set the documented way:
``Trainer(precision=...)`` (default ``bf16-mixed``: Lightning enters CPU autocast around each
``training_step``). Planted: a two-convolution net on 48 px images in memory, so training is
compute-bound; its batches are not channels_last.
Usage: lightning_precision.py [PRECISION]
"""

import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class LitConvNet(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    precision = sys.argv[1] if len(sys.argv) > 1 else "bf16-mixed"
    data = TensorDataset(torch.randn(768, 3, 48, 48), torch.randint(0, 2, (768,)))
    trainer = L.Trainer(max_epochs=1, precision=precision, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(LitConvNet(), DataLoader(data, batch_size=24))


if __name__ == "__main__":
    main()
