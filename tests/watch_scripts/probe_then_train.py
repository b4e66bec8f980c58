"""A script that looks at one batch before training, as many tutorials do
(``images, labels = next(iter(train_loader))``), then trains and validates. No planted loader
cost: the dataset is in memory and the model's work dominates, so training is compute-bound.
Usage: probe_then_train.py [EPOCHS]
"""

import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    train_set = TensorDataset(torch.randn(128, 3, 48, 48), torch.randint(0, 2, (128,)))
    val_set = TensorDataset(torch.randn(32, 3, 48, 48), torch.randint(0, 2, (32,)))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=16)
    images, labels = next(iter(train_loader))
    print("batch", tuple(images.shape), "labels", labels[:4].tolist())
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                criterion(model(x), y)
        print(f"epoch {epoch + 1} done")


if __name__ == "__main__":
    main()
