"""The in-memory form every data source returns, and the per-client split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class ArraySource:
    """A whole dataset in memory, before partitioning.

    Attributes
    ----------
    name
        The dataset's registry name (``mnist-5k``, ``femnist``, ...).
    train_x, test_x
        Inputs, ``(N, C, H, W)`` for images (uint8 0-255 or float32 0-1) or
        ``(N, D)`` for feature vectors (float32).
    train_y, test_y
        Integer class labels, ``int64``.
    num_classes
        Number of classes the model must output.
    train_groups, test_groups
        Natural per-user index sets (LEAF writers, synthetic devices), or
        ``None`` when the data has no natural split. ``test_x`` may be empty when
        the source has no test set; partitioners then hold out a per-client
        fraction of the training indices.

    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    train_groups: tuple[np.ndarray, ...] | None = None
    test_groups: tuple[np.ndarray, ...] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input example."""
        return tuple(self.train_x.shape[1:])

    @property
    def has_test_set(self) -> bool:
        """Whether the source ships its own test examples."""
        return len(self.test_y) > 0


@dataclass(frozen=True, eq=False)
class ClientSplit:
    """Indices of one client's training and test examples.

    ``test_from_train`` is True when the test indices point into the training
    arrays (a held-out fraction) rather than into the source's test set; ``pooled``
    when both point into the source's training and test arrays end to end (index
    ``len(train_y) + i`` is test example ``i``), as PFLlib's splits pool them.
    """

    train: np.ndarray
    test: np.ndarray
    test_from_train: bool = False
    pooled: bool = False


class DataUnavailableError(FileNotFoundError):
    """Raised when a dataset's files are missing (and downloading is off) or unreadable; names the file."""


class NotEnoughDataError(ValueError):
    """Raised when a partition asks for more clients or examples than exist."""
