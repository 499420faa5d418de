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
