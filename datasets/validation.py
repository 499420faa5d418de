"""A validation split held out of each client's training data, to tune on without reading the test split."""

from __future__ import annotations

import math

import numpy as np

from datasets.base import NotEnoughDataError
from datasets.registry import ClientData

# a third entropy word beside (seed, partition): the validation draw is its own stream, apart from the split's
VALIDATION_STREAM = 0x7A11D


def hold_out_validation(data: ClientData, *, fraction: float, seed: int, partition_id: int) -> ClientData:
    """``data`` with a seeded ``fraction`` of its training examples moved into its evaluation split.

    The returned ``test_x`` / ``test_y`` are the validation examples, taken out of the
    training arrays; the client's own test split is dropped, so nothing a run evaluates
    with it has seen the test split. At least one example is held out and at least one
    kept; the draw depends only on ``(seed, partition_id)``, so every process that loads
    the partition holds out the same examples. ``fraction = 0`` returns ``data`` itself.

    Raises
    ------
    ValueError
        For a fraction outside [0, 1).
    NotEnoughDataError
        When the client holds fewer than 2 training examples.

    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation-fraction must be in [0, 1), got {fraction}")
    if fraction == 0.0:
        return data
    count = len(data.train_y)
    if count < 2:
        raise NotEnoughDataError(f"client {partition_id} holds {count} training example(s); a validation split "
                                 "needs at least 2")  # fmt: skip
    order = np.random.default_rng([seed, partition_id, VALIDATION_STREAM]).permutation(count)
    held = min(count - 1, max(1, math.ceil(fraction * count)))
    validation, kept = np.sort(order[:held]), np.sort(order[held:])
    return ClientData(train_x=data.train_x[kept], train_y=data.train_y[kept], test_x=data.train_x[validation],
                      test_y=data.train_y[validation], num_classes=data.num_classes)  # fmt: skip
