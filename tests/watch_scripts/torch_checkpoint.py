"""A PyTorch loop as the tutorials write it, saving a checkpoint (``torch.save`` of the model's
and the optimizer's state, ~200 MB) after each epoch's training, then validating.

    python torch_checkpoint.py OUT_DIR [--epochs E]

The script times its own ``torch.save`` calls and prints ``SAVE epoch=E seconds=S``: the truth
the test holds watch's figures to.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()

torch.manual_seed(0)
x, y = torch.randn(256, 512), torch.randint(0, 2, (256,))
train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32, shuffle=True)
val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=32)
model = nn.Sequential(nn.Linear(512, 8192), nn.ReLU(), nn.Linear(8192, 2048), nn.ReLU(),
                      nn.Linear(2048, 2))
opt = torch.optim.Adam(model.parameters())
loss_fn = nn.CrossEntropyLoss()
for epoch in range(1, args.epochs + 1):
    model.train()
    for xb, yb in train:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
    t0 = time.perf_counter()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch},
               os.path.join(args.out, "checkpoint.pt"))
    print(f"SAVE epoch={epoch} seconds={time.perf_counter() - t0:.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        for xb, _ in val:
            model(xb)
