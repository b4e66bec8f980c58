"""Semi-supervised training in the FixMatch / Mean Teacher style: a labelled and an unlabelled
loader zipped, one step per pair. Planted cost: the unlabelled dataset sleeps 25 ms per item
(batch 8, workers=0: ~200 ms per batch), so the unlabelled loader bounds every step and the run
is input-bound. Usage: zipped_loaders.py [EPOCHS]
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowUnlabelled(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 3, 32, 32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.025)  # planted: the slow unlabelled pipeline
        return self.x[i], 0


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    labelled = TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 2, (64,)))
    labelled_loader = DataLoader(labelled, batch_size=8, shuffle=True)
    unlabelled_loader = DataLoader(SlowUnlabelled(96), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        model.train()
        for (x, y), (u, _) in zip(labelled_loader, unlabelled_loader):  # noqa: B905
            logits = model(torch.cat([x, u]))
            sup = F.cross_entropy(logits[: len(x)], y)
            pseudo = logits[len(x):].detach().argmax(1)
            loss = sup + 0.5 * F.cross_entropy(logits[len(x):], pseudo)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
