"""own-app: the model, the data loading and nothing of stamen's (as in Flower's own examples).

The data are images in ``ImageFolder`` layout (``<data-dir>/train/<class>/*.jpg``, for
example CIFAR-10 as JPEG files), split over the clients by flwr-datasets'
``DirichletPartitioner`` and, on each client, 80/20 into its own training and test data.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch
from datasets import ClassLabel, Dataset, Features, Value
from flwr_datasets.partitioner import DirichletPartitioner
from PIL import Image
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torchvision.transforms import Compose, Normalize, ToTensor

TRANSFORM = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class Net(nn.Module):
    """Flower's quickstart CNN (LeNet-5 style) for 32x32 RGB images."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@lru_cache(maxsize=2)
def image_folder(data_dir: str, max_per_class: int) -> Dataset:
    """The folder's ``train/`` images as a Hugging Face ``Dataset`` of file paths and labels (no image decoded)."""
    root = Path(data_dir) / "train"
    if not data_dir or not root.is_dir():
        raise ValueError(f"run config key 'data-dir': {data_dir!r} has no train/<class>/ folders")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        files = sorted(e.path for e in os.scandir(root / name) if e.is_file())
        files = files[:max_per_class] if max_per_class > 0 else files
        paths += files
        labels += [label] * len(files)
    features = Features({"path": Value("string"), "label": ClassLabel(names=classes)})
    return Dataset.from_dict({"path": paths, "label": labels}, features=features)


def decode(batch: dict) -> dict:
    """Open a batch's image files and normalise them (a Hugging Face dataset transform)."""
    return {"img": [TRANSFORM(Image.open(p).convert("RGB")) for p in batch["path"]], "label": batch["label"]}


def load_data(partition_id: int, num_partitions: int, run_config: dict) -> tuple[Dataset, Dataset]:
    """A client's Dirichlet share of the images, split 80/20 into its own training and test data."""
    partitioner = DirichletPartitioner(num_partitions=num_partitions, partition_by="label",
                                       alpha=float(run_config["dirichlet-alpha"]), min_partition_size=10, seed=42)
    partitioner.dataset = image_folder(str(run_config["data-dir"]), int(run_config["max-per-class"]))
    split = partitioner.load_partition(partition_id).train_test_split(test_size=0.2, seed=42)
    return split["train"].with_transform(decode), split["test"].with_transform(decode)
