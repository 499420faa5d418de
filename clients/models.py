"""The models stamen trains: ``mlp``, ``cnn``, ``cnn-small``, ``logreg`` and ``linear``."""

from __future__ import annotations

import math

import torch
from torch import nn

from strategies.contracts.common import MODELS

# (conv1 channels, conv2 channels, hidden units): the LEAF network and a CPU-sized one
# with a quarter of its channels and an eighth of its hidden layer (57,694 parameters
# on FEMNIST against 1,690,046), so benchmark B2 fits in an hour on 2 cores.
CNN_WIDTHS = {"cnn": (32, 64, 512), "cnn-small": (8, 16, 64)}


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
    """The LEAF / FedAvg FEMNIST CNN: two 5x5 conv + max-pool blocks, then one hidden layer.

    ``widths`` are the two blocks' channels and the hidden units: (32, 64, 512) is
    LEAF's network.
    """

    def __init__(self, *, in_channels: int, image_size: int, num_classes: int, widths: tuple[int, int, int]) -> None:
        super().__init__()
        first, second, hidden = widths
        pooled = image_size // 4
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, first, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(first, second, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(second * pooled * pooled, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
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


class Linear(nn.Module):
    """``x . w`` with no bias: least squares on the flattened input (one real output)."""

    def __init__(self, *, in_features: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int = 0) -> nn.Module:
    """Build model ``name`` with a seeded initialisation, so server and tests agree.

    Raises
    ------
    ValueError
        For an unknown name, or a CNN on inputs that are not square images.

    """
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not one of {MODELS}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name in CNN_WIDTHS:
            if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
                raise ValueError(f"model {name!r} needs square images (C, H, H), got input shape {input_shape}")
            return Cnn(
                in_channels=input_shape[0],
                image_size=input_shape[1],
                num_classes=num_classes,
                widths=CNN_WIDTHS[name],
            )
        in_features = math.prod(input_shape)
        if name == "linear":
            return Linear(in_features=in_features)
        cls = Mlp if name == "mlp" else LogReg
        return cls(in_features=in_features, num_classes=num_classes)


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters())
