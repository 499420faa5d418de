"""message-app: the model and the data, in the shape of Flower's PyTorch template (``flwr new``).

Two changes against the template's ``task.py``: the data come from a local image folder
(``ImageFolder`` layout, e.g. CIFAR-10 as JPEG files) through flwr-datasets'
``IidPartitioner`` instead of a Hugging Face download, and there is no ``train``
function: the stamen method's client does the local update. ``test`` is kept for the
server's own evaluation of the global model (``evaluate_fn``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch
from datasets import ClassLabel, Dataset, Features, Value
from flwr_datasets.partitioner import IidPartitioner
from PIL import Image
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader
from torchvision.transforms import Compose, Normalize, ToTensor

pytorch_transforms = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class Net(nn.Module):
    """The template's CNN (from 'PyTorch: A 60 Minute Blitz') for 32x32 RGB images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@lru_cache(maxsize=4)
def image_folder(data_dir: str, split: str, max_per_class: int) -> Dataset:
    """``<data-dir>/<split>/<class>/*`` as a Hugging Face ``Dataset`` of file paths and labels (nothing decoded)."""
    root = Path(data_dir) / split
    if not data_dir or not root.is_dir():
        raise ValueError(f"run config key 'data-dir': {data_dir!r} has no {split}/<class>/ folders")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(e.path for e in os.scandir(root / name) if e.is_file())
        files = files[:max_per_class] if max_per_class > 0 else files
        paths += files
        labels += [label] * len(files)
    features = Features({"path": Value("string"), "label": ClassLabel(names=classes)})
    return Dataset.from_dict({"path": paths, "label": labels}, features=features)


def apply_transforms(batch: dict) -> dict:
    """Open a batch's image files and normalise them, under the template's keys ``img`` and ``label``."""
    return {"img": [pytorch_transforms(Image.open(p).convert("RGB")) for p in batch["path"]], "label": batch["label"]}


def load_data(partition_id: int, num_partitions: int, batch_size: int, data_dir: str, max_per_class: int = 0):
    """A client's IID share of the training images, 80% to train on and 20% to test on, as DataLoaders."""
    partitioner = IidPartitioner(num_partitions=num_partitions)
    partitioner.dataset = image_folder(data_dir, "train", max_per_class)
    partition_train_test = partitioner.load_partition(partition_id).train_test_split(test_size=0.2, seed=42)
    partition_train_test = partition_train_test.with_transform(apply_transforms)
    trainloader = DataLoader(partition_train_test["train"], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(partition_train_test["test"], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset(data_dir: str, max_per_class: int = 0) -> DataLoader:
    """The test images, for the server's evaluation of the global model."""
    return DataLoader(image_folder(data_dir, "test", max_per_class).with_transform(apply_transforms), batch_size=128)


def test(net: nn.Module, testloader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Mean loss and accuracy of ``net`` on ``testloader``."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
