"""A training script as the Accelerate docs write one: Accelerator, prepare, accelerator.backward.
Launched with `accelerate launch --multi_gpu --num_processes 2` on a CPU-only machine (gloo)."""

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator(cpu=True)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
dataset = TensorDataset(torch.randn(320, 64, generator=g), torch.randn(320, 5, generator=g))
loader = DataLoader(dataset, batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

for _epoch in range(2):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
accelerator.end_training()
