"""``fedavg-cnn``: PFLlib's 4-layer CNN (``FedAvgCNN``), the network of PFLlib's and FedALA's CIFAR-10 tables.

Two 5x5 convolutions without padding (32 and 64 channels), each followed by ReLU and a
2x2 max-pool, then a 512-unit hidden layer and the classifier: on 3x32x32 inputs the
flattened features are 64 x 5 x 5 = 1600 (PFLlib's ``dim=1600``), on 1x28x28 they are
1024. ``fedavg-cnn-bn`` adds BatchNorm after each convolution and the hidden layer (FedBN's
setting: its normalisation layers stay on the clients).
"""

from __future__ import annotations

from torch import nn

from clients.models.split import SequentialSplit

HIDDEN = 512


def flattened_side(side: int) -> int:
    """The feature maps' side after two (5x5 valid conv, 2x2 pool) blocks."""
    return ((side - 4) // 2 - 4) // 2


class FedAvgCnn(SequentialSplit):
    """conv 5x5 32 -> ReLU -> pool 2 -> conv 5x5 64 -> ReLU -> pool 2 -> fc 512 -> ReLU -> fc C.

    With ``batch_norm``, a BatchNorm follows each convolution and the hidden layer (before
    their ReLU). The representation is the hidden layer's output (512-d).
    """

    def __init__(self, *, in_channels: int, height: int, width: int, num_classes: int, batch_norm: bool) -> None:
        super().__init__()

        def norm(kind: type[nn.Module], channels: int) -> list[nn.Module]:
            return [kind(channels)] if batch_norm else []

        flat = 64 * flattened_side(height) * flattened_side(width)
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5), *norm(nn.BatchNorm2d, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5), *norm(nn.BatchNorm2d, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(flat, HIDDEN), *norm(nn.BatchNorm1d, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, num_classes),
        )  # fmt: skip


def image_dims(input_shape: tuple[int, ...], name: str, smallest: int) -> tuple[int, int, int]:
    """(C, H, W) of an image shape at least ``smallest`` pixels a side.

    Raises
    ------
    ValueError
        If ``input_shape`` is not (C, H, W) or the image is too small for the network.

    """
    if len(input_shape) != 3:
        raise ValueError(f"model {name!r} needs images (C, H, W), got input shape {input_shape}")
    channels, height, width = input_shape
    if min(height, width) < smallest:
        raise ValueError(f"model {name!r} needs images at least {smallest}x{smallest}, got {height}x{width}")
    return channels, height, width


def build_fedavg_cnn(input_shape: tuple[int, ...], num_classes: int) -> FedAvgCnn:
    """PFLlib's FedAvgCNN for images of ``input_shape``."""
    channels, height, width = image_dims(input_shape, "fedavg-cnn", 16)
    return FedAvgCnn(in_channels=channels, height=height, width=width, num_classes=num_classes, batch_norm=False)


def build_fedavg_cnn_bn(input_shape: tuple[int, ...], num_classes: int) -> FedAvgCnn:
    """FedAvgCNN with BatchNorm after both convolutions and the hidden layer."""
    channels, height, width = image_dims(input_shape, "fedavg-cnn-bn", 16)
    return FedAvgCnn(in_channels=channels, height=height, width=width, num_classes=num_classes, batch_norm=True)
