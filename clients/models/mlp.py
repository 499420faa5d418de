"""``mlp``: the Per-FedAvg paper's network, 784 -> 80 -> 60 -> C with ELU (the input flattened)."""

from __future__ import annotations

import math

from torch import nn

from clients.models.split import SequentialSplit


class Mlp(SequentialSplit):
    """784 -> 80 -> 60 -> C with ELU: the Per-FedAvg paper's network (input flattened); the representation is 60-d."""

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, 80), nn.ELU(), nn.Linear(80, 60), nn.ELU(), nn.Linear(60, num_classes)
        )


def build_mlp(input_shape: tuple[int, ...], num_classes: int) -> Mlp:
    """The MLP for inputs of ``input_shape`` (flattened) and ``num_classes`` outputs."""
    return Mlp(in_features=math.prod(input_shape), num_classes=num_classes)
