"""A compute-bound convolutional loop (in-memory data, workers=0), written the way PyTorch's
AMP and memory-format tutorials write it when the flags are given: ``--autocast`` runs each
training forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``, ``--channels-last``
moves the model and each batch to ``torch.channels_last``. Planted truth: what the script does.
Usage: torch_precision.py [--autocast] [--channels-last]
"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

autocast, channels_last = "--autocast" in sys.argv, "--channels-last" in sys.argv
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(96, 3, 32, 32), torch.randint(0, 2, (96,))),
                    batch_size=8)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 2))
fmt = torch.channels_last if channels_last else torch.contiguous_format
model = model.to(memory_format=fmt)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _epoch in range(2):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(x.to(memory_format=fmt)), y)
        loss.backward()
        optimizer.step()
