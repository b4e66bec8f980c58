"""Gradient accumulation as the Hugging Face and PyTorch docs write it: ``loss /
accum_steps; loss.backward()`` every batch, ``optimizer.step()`` every ``accum_steps``.
Every batch is a training step (backward), not only the ones with an optimizer step. Planted
cost: the dataset sleeps 15 ms per item (workers=0), so training is input-bound.
Usage: grad_accumulation.py [EPOCHS]
"""

import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 16), torch.randint(0, 2, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.015)  # planted
        return self.x[i], self.y[i]


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    accum_steps = 4
    loader = DataLoader(Slow(128), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch + 1}: loss {loss.item() * accum_steps:.3f}")


if __name__ == "__main__":
    main()
