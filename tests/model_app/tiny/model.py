"""A throwaway model, registered at run time: a file of its own and one ``register_model`` line, nothing else.

Imported by this app's ServerApp and ClientApp modules, so every process that builds the
model (the server, each simulated client's worker) has registered it first.
"""

from __future__ import annotations

import math

from torch import nn

from clients.models import Model, SplitModel, register_model
from strategies.contracts.models import ModelCard


class TinyNet(SplitModel):
    """Flatten -> 16 tanh units (the representation) -> C (the head)."""

    head_prefix = "out"

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 16), nn.Tanh())
        self.out = nn.Linear(16, num_classes)

    def features(self, x):
        return self.body(x)

    def classify(self, z):
        return self.out(z)


def build_tiny(input_shape: tuple[int, ...], num_classes: int) -> TinyNet:
    return TinyNet(in_features=math.prod(input_shape), num_classes=num_classes)


CARD = ModelCard(name="tiny-net", summary="a test's throwaway network", inputs="flat", smooth=True)
register_model(Model(CARD, build_tiny))
