"""The convex models: ``logreg`` (multinomial logistic regression) and ``linear`` (least squares)."""

from __future__ import annotations

import math

from torch import nn

from clients.models.split import SequentialSplit


class LogReg(SequentialSplit):
    """Multinomial logistic regression on the flattened input (a convex model); its representation is the input."""

    def __init__(self, *, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


class Linear(SequentialSplit):
    """``x . w`` with no bias: least squares on the flattened input (one real output)."""

    def __init__(self, *, in_features: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 1, bias=False))


def build_logreg(input_shape: tuple[int, ...], num_classes: int) -> LogReg:
    """Logistic regression from the flattened ``input_shape`` to ``num_classes``."""
    return LogReg(in_features=math.prod(input_shape), num_classes=num_classes)


def build_linear(input_shape: tuple[int, ...], num_classes: int) -> Linear:
    """Least squares on the flattened ``input_shape`` (``num_classes`` is unused: one real output)."""
    return Linear(in_features=math.prod(input_shape))
