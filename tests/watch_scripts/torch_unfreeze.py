"""Transfer learning as torchvision's fine-tuning tutorial writes it, in two stages: the
pretrained trunk frozen (``requires_grad = False``) and a new head trained with SGD, then from
epoch 3 the whole network with a new Adam optimizer. Planted truth: after the unfreezing the
trunk's gradients (4 bytes a parameter) and Adam's two moments (8 bytes a parameter) exist,
where the first steps had the head's alone; no cost is planted in the input (tensors in memory,
workers=0): each phase is compute-bound. With ``--top`` stage two unfreezes the last residual
block (``layer4[-1]``: 42 % of the parameters with the head) alone, the tutorials' other way,
and Adam gets the trainable parameters.
Usage: torch_unfreeze.py [EPOCHS] [--top]
"""

import sys

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
args = [a for a in sys.argv[1:] if a != "--top"]
top = "--top" in sys.argv
epochs = int(args[0]) if args else 4
x, y = torch.randn(256, 3, 64, 64), torch.randint(0, 2, (256,))
train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=16, shuffle=True)
val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=16)
model = torchvision.models.resnet18(weights=None)  # the tutorial loads ImageNet weights here
for p in model.parameters():
    p.requires_grad = False
model.fc = nn.Linear(model.fc.in_features, 2)
optimizer = torch.optim.SGD(model.fc.parameters(), lr=0.01, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for epoch in range(epochs):
    if epoch == 2:  # stage two: fine-tune everything, or the top block
        for p in (model.layer4[-1] if top else model).parameters():
            p.requires_grad = True
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    for inputs, labels in train:
        optimizer.zero_grad()
        loss = criterion(model(inputs), labels)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for inputs, _labels in val:
            model(inputs)
