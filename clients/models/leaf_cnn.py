"""``cnn`` and ``cnn-small``: the LEAF / FedAvg FEMNIST CNN and a CPU-sized one with a quarter of its channels."""

from __future__ import annotations

from torch import nn

from clients.models.split import SequentialSplit

# (conv1 channels, conv2 channels, hidden units): the LEAF network and a CPU-sized one
# with a quarter of its channels and an eighth of its hidden layer (57,694 parameters
# on FEMNIST against 1,690,046), so benchmark B2 fits in an hour on 2 cores.
LEAF_WIDTHS = (32, 64, 512)
SMALL_WIDTHS = (8, 16, 64)


class Cnn(SequentialSplit):
    """The LEAF / FedAvg FEMNIST CNN: two 5x5 conv (padding 2) + max-pool blocks, then one hidden layer.

    ``widths`` are the two blocks' channels and the hidden units: (32, 64, 512) is
    LEAF's network. The representation is the hidden layer's output.
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


def square_image(input_shape: tuple[int, ...], name: str) -> tuple[int, int]:
    """(channels, side) of a square image shape.

    Raises
    ------
    ValueError
        If ``input_shape`` is not (C, H, H).

    """
    if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
        raise ValueError(f"model {name!r} needs square images (C, H, H), got input shape {input_shape}")
    return input_shape[0], input_shape[1]


def build_cnn(input_shape: tuple[int, ...], num_classes: int) -> Cnn:
    """LEAF's FEMNIST CNN (32, 64, 512)."""
    channels, side = square_image(input_shape, "cnn")
    return Cnn(in_channels=channels, image_size=side, num_classes=num_classes, widths=LEAF_WIDTHS)


def build_cnn_small(input_shape: tuple[int, ...], num_classes: int) -> Cnn:
    """The CPU-sized CNN (8, 16, 64)."""
    channels, side = square_image(input_shape, "cnn-small")
    return Cnn(in_channels=channels, image_size=side, num_classes=num_classes, widths=SMALL_WIDTHS)
