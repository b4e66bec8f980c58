"""A DDP training script as the PyTorch DDP tutorial writes one (torchrun, gloo on the CPU),
with a DataLoader over a DistributedSampler. Knobs for the tests (environment variables):

- LOAD_S: every rank's dataset sleeps LOAD_S per batch (a balanced job with real loading).
- SLOW_LOAD_RANK=k, SLOW_LOAD_S: that rank's dataset sleeps SLOW_LOAD_S more per batch.
- SLOW_BACKWARD_RANK=k, SLOW_BACKWARD_S: that rank sleeps in a backward hook (backward only);
  with SLOW_BACKWARD_STEPS=a-b only at global steps a..b (one bad stretch).
- KILL_RANK=k, KILL_STEP=n: that rank SIGKILLs itself at step n of the second epoch.
"""

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

BATCH = 8
EPOCHS = int(os.environ.get("EPOCHS", "2"))
ITEMS = int(os.environ.get("ITEMS", "320"))


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(64, 64)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(64, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class Points(Dataset):
    def __init__(self, n, sleep_per_item_s):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randn(n, 5, generator=g)
        self.sleep_s = sleep_per_item_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def knob(name, rank, default="0"):
    return float(os.environ.get(name + "_S", default)) \
        if os.environ.get(name + "_RANK") == str(rank) else 0.0


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    load_s = float(os.environ.get("LOAD_S", "0")) + knob("SLOW_LOAD", rank)
    dataset = Points(ITEMS, load_s / BATCH)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    model = ToyModel()
    ddp_model = DDP(model)
    slow_backward = knob("SLOW_BACKWARD", rank)
    first, _, last = os.environ.get("SLOW_BACKWARD_STEPS", "0-1000000").partition("-")
    step = [0]

    def slow_hook(module, grad_output):
        if int(first) <= step[0] <= int(last):
            time.sleep(slow_backward)

    if slow_backward:
        model.net1.register_full_backward_pre_hook(slow_hook)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        ddp_model.train()
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            outputs = ddp_model(x)
            loss_fn(outputs, y).backward()
            optimizer.step()
            step[0] += 1
            if epoch == 1 and os.environ.get("KILL_RANK") == str(rank) \
                    and i == int(os.environ.get("KILL_STEP", "5")):
                os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
