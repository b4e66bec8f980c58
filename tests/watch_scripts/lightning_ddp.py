"""A LightningModule trained as the Lightning docs write it, with
Trainer(strategy="ddp", accelerator="cpu", devices=2): this process is rank 0 and launches rank 1.
"""

import os
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class LitModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


if __name__ == "__main__":
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(320, 64, generator=g), torch.randn(320, 5, generator=g))
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LitModel(), DataLoader(dataset, batch_size=8))
    # A rank that takes a while to wind down (the test plants it): rank 0 does not wait for it.
    if os.environ.get("LOCAL_RANK") == "1":
        time.sleep(float(os.environ.get("RANK1_LINGER_S", "0")))
