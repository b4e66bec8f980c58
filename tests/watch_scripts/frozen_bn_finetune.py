"""Fine-tuning with frozen BatchNorm, as the torchvision fine-tuning tutorial and detection
references write it: ``model.train()``, then every BatchNorm layer back to ``eval()`` so its
running statistics stay those of pre-training. Planted cost: the dataset sleeps 20 ms per item
(workers=0), so training is input-bound. Usage: frozen_bn_finetune.py [EPOCHS]
"""

import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.02)  # planted: reading and decoding one image
        return self.x[i], self.y[i]


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))


def freeze_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    train_loader = DataLoader(SlowImages(96, 0), batch_size=8, shuffle=True)
    val_loader = DataLoader(SlowImages(32, 1), batch_size=8)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        model.apply(lambda m: m.eval() if isinstance(m, nn.BatchNorm2d) else None)
        for images, target in train_loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in val_loader)
        print(f"epoch {epoch + 1}: val acc {correct / 32:.2f}")


if __name__ == "__main__":
    main()
