"""A loop with ``torch.compile``, as PyTorch's torch.compile tutorial writes it: the model is
wrapped once (``model = torch.compile(model)``), then trained and validated as usual. The first
call compiles (seconds; it lands in the first steps, the warm-up), and the ragged last batch
(``drop_last=False``: 100 items in batches of 8) recompiles once for its new shape, mid-phase.
Planted cost: the dataset sleeps 40 ms per item (workers=0), so a steady step waits ~320 ms for
data against ~1 ms of compute: input-bound by a wide margin, even with a multi-second recompile
among the steady steps.

Backend: ``aot_eager`` (dynamo traces and AOTAutograd builds the forward and backward graphs,
run eagerly). The default inductor backend works on this CPU too, but compiling even a tiny
model took minutes on the loaded CI machine (it runs a C++ compiler). Usage: compiled_loop.py
[EPOCHS] [BACKEND]
"""

import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowVectors(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.04)  # planted: reading and decoding one sample
        return self.x[i], self.y[i]


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    backend = sys.argv[2] if len(sys.argv) > 2 else "aot_eager"
    # 100 items, batch 8, drop_last=False: 12 full batches and a ragged one of 4 (a recompile).
    train_loader = DataLoader(SlowVectors(100, 0), batch_size=8, shuffle=True)
    val_loader = DataLoader(SlowVectors(16, 1), batch_size=8)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val_loader)
        print(f"epoch {epoch + 1}: val acc {correct / 16:.2f}")


if __name__ == "__main__":
    main()
