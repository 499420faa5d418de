"""The representation API every registered model offers: ``features(x)``, ``classify(z)`` and its head's arrays.

A model is split into a **representation** ``z = features(x)`` (everything up to the
classifier's input) and a **head** ``classify(z)`` (the classifier), as PFLlib's
``BaseHeadSplit`` splits its networks. MOON's contrastive loss and FedProto's class
prototypes read ``z``; FedRep, FedPer and any rule that keeps the head at home read the
head's arrays (:func:`head_names`). ``forward(x, with_features=True)`` returns the
output and ``z`` from one pass, so a loss term on the representation costs no second
forward, and ``torch.func.functional_call`` can evaluate both at any parameters.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class SplitModel(nn.Module):
    """A network ``classify(features(x))``; a subclass defines both and names its head's ``state_dict`` prefix."""

    head_prefix: ClassVar[str] = ""  # e.g. "fc": every state_dict array under "fc." belongs to the head

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The representation: the classifier's input, one row per example."""
        raise NotImplementedError(f"{type(self).__name__} must define features")

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """The head: the output (logits) from the representation."""
        raise NotImplementedError(f"{type(self).__name__} must define classify")

    def forward(self, x: torch.Tensor, with_features: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        z = self.features(x)
        out = self.classify(z)
        return (out, z) if with_features else out


class SequentialSplit(SplitModel):
    """A ``self.layers`` ``nn.Sequential`` whose last layer is the head (the five original models' form).

    Its arrays keep the names ``layers.<i>.<weight|bias>`` and its forward pass is the
    Sequential's own, so checkpoints and figures from before the split are unchanged.
    """

    layers: nn.Sequential

    @property
    def head_prefix(self) -> str:  # type: ignore[override]
        return f"layers.{len(self.layers) - 1}"

    def features(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = layer(x)
        return x

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.layers[-1](z)

    def forward(self, x: torch.Tensor, with_features: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not with_features:
            return self.layers(x)
        return super().forward(x, with_features=True)


def head_names(model: nn.Module) -> tuple[str, ...]:
    """The ``state_dict`` names of the model's head; ``()`` for a model without the split."""
    prefix = getattr(model, "head_prefix", "")
    if not prefix:
        return ()
    return tuple(name for name in model.state_dict() if name.startswith(f"{prefix}."))


def has_representation(model: nn.Module) -> bool:
    """Whether ``model`` offers ``features``/``classify`` (a :class:`SplitModel`)."""
    return isinstance(model, SplitModel)
