"""Weighted means and spreads of per-client metrics (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """``sum(w * v) / sum(w)``; NaN when there is nothing to average."""
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0 or w.sum() <= 0:
        return float("nan")
    return float(np.dot(w, np.asarray(values, dtype=np.float64)) / w.sum())


def spread(values: Sequence[float]) -> dict[str, float]:
    """Minimum, median and maximum over clients (NaN when empty)."""
    if len(values) == 0:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    v = np.asarray(values, dtype=np.float64)
    return {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())}


def summarise(name: str, values: Sequence[float], weights: Sequence[float]) -> dict[str, float]:
    """``{name: weighted mean, name-client-mean, name-min, name-median, name-max}``.

    ``name`` is weighted by example count; ``name-client-mean`` weighs every
    client equally (the Per-FedAvg paper's "average over users").
    """
    out = {name: weighted_mean(values, weights), f"{name}-client-mean": weighted_mean(values, [1.0] * len(values))}
    out.update({f"{name}-{k}": v for k, v in spread(values).items()})
    return out
