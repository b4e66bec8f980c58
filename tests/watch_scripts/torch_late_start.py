"""A script that takes its time before its loop: planted, 1.0 s before `import torch` (the
script's own set-up) and 1.5 s after it (building a model, listing files), then a small
in-memory loop, 2 epochs of 6 steps."""

import time

time.sleep(1.0)  # planted: before the framework's import

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

time.sleep(1.5)  # planted: after it
model = torch.nn.Linear(16, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(48, 16), torch.randint(0, 2, (48,))), batch_size=8)
for _epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
