"""Model arrays <-> one flat vector, for strategies that do maths on whole models (pure numpy)."""

from __future__ import annotations

import numpy as np


def flatten(arrays: list[np.ndarray], dtype: type = np.float32) -> np.ndarray:
    """All arrays, raveled and concatenated in order, as ``dtype``."""
    return np.concatenate([a.astype(dtype).ravel() for a in arrays])


def unflatten(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The inverse of :func:`flatten` for arrays of ``shapes``."""
    sizes = [int(np.prod(s)) for s in shapes]
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    return [part.reshape(shape) for part, shape in zip(parts, shapes, strict=True)]


def weighted_average_inplace(models: list[list[np.ndarray]], weights: list[float]) -> list[np.ndarray]:
    """``sum_i w_i x_i / sum_i w_i`` per floating-point layer, overwriting the inputs; non-float layers take the max.

    The same operations, in the same order, as Flower's ``aggregate_inplace`` (scale
    each model by its share in place, then add them up in reply order), so results
    are bit-for-bit those of ``FedAvg(inplace=True)``; it works on models already
    decoded, so each reply is decoded once per round instead of twice.

    An array that is not floating point (BatchNorm's ``num_batches_tracked``, an integer
    counter; a boolean mask) is never averaged: scaling an integer by a share below 1
    truncates it to 0. Its result is the element-wise maximum over the models (for a
    counter: the largest count any client reached).
    """
    floats = [np.issubdtype(x.dtype, np.floating) for x in models[0]]
    if not all(floats):
        counted = {i: np.asarray(np.max([model[i] for model in models], axis=0)) for i, f in enumerate(floats) if not f}
        averaged = weighted_average_inplace([[x for x, f in zip(m, floats, strict=True) if f] for m in models], weights)
        rest = iter(averaged)
        return [counted[i] if i in counted else next(rest) for i in range(len(floats))]
    if not models[0]:
        return []
    total = sum(weights)
    shares = np.asarray([w / total for w in weights])

    def scaled(x: np.ndarray, share: np.float64) -> np.ndarray:
        if np.can_cast(share, x.dtype, casting="same_kind"):
            return np.multiply(x, share, out=x)
        return np.multiply(x, np.array(share, x.dtype), out=x)

    layers = [scaled(x, shares[0]) for x in models[0]]
    for i, model in enumerate(models[1:], start=1):
        layers = [np.add(acc, scaled(x, shares[i]), out=acc) for acc, x in zip(layers, model, strict=True)]
    return layers
