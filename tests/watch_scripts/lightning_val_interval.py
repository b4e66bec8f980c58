"""A LightningModule trained as Lightning's docs write it, validating twice per epoch
(``val_check_interval=0.5``). Planted costs: the training dataset sleeps 20 ms per item (batch 8,
workers=0: ~160 ms per batch against a few ms of compute), so training is input-bound; the
module overrides the documented ``transfer_batch_to_device`` hook to sleep 40 ms before copying
(a slow host-to-device copy, as a large pageable batch has on a GPU), so validation, whose data
is in memory, is transfer-bound.
Usage: lightning_val_interval.py [EPOCHS]
"""

import sys
import time

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowImages(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 3, 16, 16), torch.randint(0, 2, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.02)  # planted
        return self.x[i], self.y[i]


class LitClassifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.ReLU(),
                                 nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        time.sleep(0.04)  # planted: a slow host-to-device copy
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    train = DataLoader(SlowImages(128), batch_size=8, shuffle=True)
    val = DataLoader(TensorDataset(torch.randn(32, 3, 16, 16), torch.randint(0, 2, (32,))),
                     batch_size=8)
    trainer = L.Trainer(max_epochs=epochs, val_check_interval=0.5, accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(LitClassifier(), train, val)


if __name__ == "__main__":
    main()
