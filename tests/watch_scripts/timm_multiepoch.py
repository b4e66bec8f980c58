"""A training loop on timm's ``MultiEpochsDataLoader`` (timm's ``create_loader(...,
use_multi_epochs_loader=True)``): one iterator, created in the loader's constructor, serves every
epoch, so ``DataLoader.__iter__`` runs once for the whole run. Planted cost: the dataset sleeps
100 ms per item, 800 ms per 8-image batch per worker, ~400 ms per batch from 2 workers, against
a few milliseconds of compute (a few hundred on a loaded machine): input-bound. Usage: timm_multiepoch.py [EPOCHS]
"""

import sys
import time

import torch
import torch.nn as nn
from timm.data.loader import MultiEpochsDataLoader
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 3, 16, 16), torch.randint(0, 2, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.1)  # planted
        return self.x[i], self.y[i]


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    train_loader = MultiEpochsDataLoader(Slow(64), batch_size=8, shuffle=True, num_workers=2)
    val_loader = DataLoader(Slow(16), batch_size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, _ in val_loader:
                model(x)
        print(f"epoch {epoch + 1} done")


if __name__ == "__main__":
    main()
