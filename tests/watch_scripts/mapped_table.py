"""A pytorch/examples-style loop over an ImageFolder whose fifth step pages in another file: a
table mapped with ``np.load(mmap_mode="r")`` and read whole (class weights, an embedding table,
a lookup a first step builds), the way a library's pages come in as a first step runs.

    python mapped_table.py DATA_DIR TABLE.npy [EPOCHS]
"""

import sys

import numpy as np
import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms


def main() -> None:
    data, table_path = sys.argv[1], sys.argv[2]
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    train_set = datasets.ImageFolder(f"{data}/train", transforms.ToTensor())
    loader = torch.utils.data.DataLoader(train_set, batch_size=8, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), 0.01)
    table = None
    for epoch in range(epochs):
        model.train()
        for i, (images, target) in enumerate(loader):
            if table is None and i == 4:  # a step maps the table and reads every page of it
                table = np.load(table_path, mmap_mode="r")
                print(f"table checksum {int(table.sum(dtype=np.uint64))}")
            loss = nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
