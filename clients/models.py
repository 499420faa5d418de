"""The models stamen trains: ``mlp``, ``cnn`` and ``logreg``."""

from __future__ import annotations

import math

import torch
from torch import nn

MODELS = ("mlp", "cnn", "logreg")
IMAGE_MODELS = ("cnn",)


class Mlp(nn.Module):
    """784 -> 80 -> 60 -> C with ELU: the Per-FedAvg paper's network (input flattened)."""

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, 80), nn.ELU(), nn.Linear(80, 60), nn.ELU(), nn.Linear(60, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Cnn(nn.Module):
    """The LEAF / FedAvg FEMNIST CNN: two 5x5 conv + max-pool blocks (32, 64), FC 512."""

    def __init__(self, *, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        pooled = image_size // 4
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * pooled * pooled, 512), nn.ReLU(), nn.Linear(512, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class LogReg(nn.Module):
    """Multinomial logistic regression on the flattened input (a convex model)."""

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """Build model ``name`` with a seeded initialisation, so server and tests agree.

    Raises
    ------
    ValueError
        For an unknown name, or ``cnn`` on inputs that are not square images.

    """
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {MODELS}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "cnn":
            if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
                raise ValueError(f"model 'cnn' needs square images (C, H, H), got input shape {input_shape}")
            return Cnn(in_channels=input_shape[0], image_size=input_shape[1], num_classes=num_classes)
        in_features = math.prod(input_shape)
        cls = Mlp if name == "mlp" else LogReg
        return cls(in_features=in_features, num_classes=num_classes)


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters())
