"""A LightningModule whose ModelCheckpoint keeps every epoch's checkpoint (~100 MB each: two wide
Linear layers and Adam's state), as Lightning's docs write it.

    python lightning_checkpoint.py OUT_DIR [--epochs E]

The test holds watch's count of writes to the checkpoint files written.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()


class Wide(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 4096), nn.ReLU(), nn.Linear(4096, 2048),
                                 nn.ReLU(), nn.Linear(2048, 2))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.Adam(self.parameters())


torch.manual_seed(0)
x, y = torch.randn(256, 512), torch.randint(0, 2, (256,))
train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32, shuffle=True)
val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=32)
every = ModelCheckpoint(dirpath=args.out, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False,
                    callbacks=[every], enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0)
trainer.fit(Wide(), train, val)
