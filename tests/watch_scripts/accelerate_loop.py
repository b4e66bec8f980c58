"""A training loop in Hugging Face Accelerate's documented shape: ``accelerator.prepare`` wraps
the loaders in ``DataLoaderShard`` (which fetches one batch ahead), ``accelerator.backward``
replaces ``loss.backward()``. Planted cost: the training dataset sleeps 20 ms per item (batch 8,
workers=0), so training is input-bound. ``--bf16``: ``Accelerator(mixed_precision="bf16")``,
whose autocast the prepared model enters inside its own forward.
Usage: accelerate_loop.py [EPOCHS] [--bf16]
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowImages(Dataset):
    def __init__(self, n):
        self.x, self.y = torch.randn(n, 3, 16, 16), torch.randint(0, 2, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.02)  # planted
        return self.x[i], self.y[i]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    epochs = int(args[0]) if args else 2
    accelerator = Accelerator(cpu=True, mixed_precision="bf16" if "--bf16" in sys.argv else "no")
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_dataloader = DataLoader(SlowImages(96), batch_size=8, shuffle=True)
    eval_dataloader = DataLoader(
        TensorDataset(torch.randn(16, 3, 16, 16), torch.randint(0, 2, (16,))), batch_size=8)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    for epoch in range(epochs):
        model.train()
        for inputs, targets in train_dataloader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
        model.eval()
        for inputs, targets in eval_dataloader:
            with torch.no_grad():
                F.cross_entropy(model(inputs), targets)
        accelerator.print(f"epoch {epoch + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
