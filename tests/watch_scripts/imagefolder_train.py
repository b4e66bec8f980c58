"""A training script stepscope did not write, in the style of pytorch/examples (imagenet/main.py):
ImageFolder datasets, DataLoader with workers, train() and validate() functions, model.train()
and model.eval(), torch.no_grad() in validation. Usage: imagefolder_train.py DATA_DIR [EPOCHS]
"""

import sys
import time

import torch
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.transforms as transforms


class TinyNet(nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def train(train_loader, model, criterion, optimizer, epoch, device):
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 2 == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}] loss {loss.item():.4f} "
                  f"time {time.time() - end:.3f}")
        end = time.time()


def validate(val_loader, model, criterion, device):
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, target in val_loader:
            images = images.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            output = model(images)
            criterion(output, target)
            correct += (output.argmax(1) == target).sum().item()
    print(f" * Acc {100.0 * correct / len(val_loader.dataset):.1f}")


def main():
    data = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        f"{data}/train", transforms.Compose([
            transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    val_dataset = datasets.ImageFolder(
        f"{data}/val", transforms.Compose([transforms.ToTensor(), normalize]))
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=8, shuffle=True, num_workers=2)
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=8, shuffle=False, num_workers=2)
    model = TinyNet().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    for epoch in range(epochs):
        train(train_loader, model, criterion, optimizer, epoch, device)
        validate(val_loader, model, criterion, device)


if __name__ == "__main__":
    main()
