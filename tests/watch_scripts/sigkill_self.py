"""Trains one epoch, then SIGKILLs itself two steps into the second one."""

import os
import signal

import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(32, 10), torch.randint(0, 2, (32,))), batch_size=8)
model = torch.nn.Linear(10, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    model.train()
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if epoch == 1 and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
