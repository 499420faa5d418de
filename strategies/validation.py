"""Checks a client's reply must pass before it may touch the global model (pure numpy)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

# Largest loss a sane client reports; cross-entropy of a uniform guess over 1e6
# classes is ~14, so anything beyond this is a broken client, not a hard task.
MAX_REASONABLE_LOSS = 1e6
ACCURACY_KEYS = ("accuracy", "global-accuracy")
LOSS_KEYS = ("train-loss", "global-loss")
COUNT_KEYS = ("grad-evals", "sample-grads", "local-steps")
COSINE_KEYS = ("phi",)


def metrics_problem(metrics: Mapping[str, object]) -> str | None:
    """Why the scalar metrics of a reply are absurd, or ``None`` when they are fine."""
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            return f"metric {key!r} is not finite ({value})"
    for key in ACCURACY_KEYS:
        if key in metrics and not 0.0 <= float(metrics[key]) <= 1.0:
            return f"metric {key!r} = {metrics[key]} is outside [0, 1]"
    for key in LOSS_KEYS:
        if key in metrics and not 0.0 <= float(metrics[key]) <= MAX_REASONABLE_LOSS:
            return f"metric {key!r} = {metrics[key]} is outside [0, {MAX_REASONABLE_LOSS:g}]"
    for key in COSINE_KEYS:
        if key in metrics and not -1.0 <= float(metrics[key]) <= 1.0:
            return f"metric {key!r} = {metrics[key]} is outside [-1, 1]"
    for key in COUNT_KEYS:
        if key in metrics and float(metrics[key]) < 0:
            return f"metric {key!r} = {metrics[key]} is negative"
    return None


def fit_reply_problem(
    arrays: Sequence[np.ndarray],
    num_examples: int,
    metrics: Mapping[str, object],
    expected_shapes: Sequence[tuple[int, ...]],
) -> str | None:
    """Why a training reply must be rejected, or ``None`` when it may be aggregated.

    A reply is rejected when it has the wrong number of arrays, an array of the
    wrong shape, a non-finite value, a non-positive example count, or absurd metrics.
    """
    if len(arrays) != len(expected_shapes):
        return f"{len(arrays)} arrays, expected {len(expected_shapes)}"
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if tuple(array.shape) != tuple(shape):
            return f"array {i} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
            return f"array {i} holds non-finite or non-numeric values"
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    return metrics_problem(metrics)


def evaluate_reply_problem(loss: float, num_examples: int, metrics: Mapping[str, object]) -> str | None:
    """Why an evaluation reply must be rejected, or ``None`` when it may be aggregated.

    Classifiers report accuracies; regression clients (least squares) report losses only.
    """
    if not math.isfinite(loss) or not 0.0 <= loss <= MAX_REASONABLE_LOSS:
        return f"loss {loss} is not a finite value in [0, {MAX_REASONABLE_LOSS:g}]"
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    return metrics_problem(metrics)
