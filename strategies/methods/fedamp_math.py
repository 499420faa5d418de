"""FedAMP's server maths (pure numpy): the attention row xi_i over the kept models and the cloud model u_i."""

from __future__ import annotations

import numpy as np


def attention_row(models: np.ndarray, i: int, *, alpha: float, sigma: float, attention: str) -> np.ndarray:
    """Row ``i`` of FedAMP's ``xi``: the weights of the ``K`` kept models (rows of ``models``) in ``u_i``.

    ``cosine`` (the released code): ``xi_ij = alpha softmax_j(sigma cos(w_i, w_j))`` over ``j != i``,
    so they sum to ``alpha``. ``exponential`` (the paper, ``A(x) = 1 - e^(-x/sigma)``):
    ``xi_ij = alpha A'(||w_i - w_j||^2) = alpha e^(-||w_i - w_j||^2 / sigma) / sigma``.
    Either way ``xi_ii = 1 - sum_{j != i} xi_ij``. Computed in float64.
    """
    models = np.asarray(models, dtype=np.float64)
    others = np.arange(len(models)) != i
    row = np.zeros(len(models))
    if others.any():
        if attention == "cosine":
            norms = np.linalg.norm(models, axis=1)
            cosine = models[others] @ models[i] / np.maximum(norms[others] * norms[i], np.finfo(float).tiny)
            logits = sigma * cosine
            weights = np.exp(logits - logits.max())
            row[others] = alpha * weights / weights.sum()
        elif attention == "exponential":
            distances = ((models[others] - models[i]) ** 2).sum(axis=1)
            row[others] = alpha * np.exp(-distances / sigma) / sigma
        else:
            raise ValueError(f"attention {attention!r} is not one of ('cosine', 'exponential')")
    row[i] = 1.0 - row[others].sum()
    return row


def worst_self_weight(num_clients: int, *, alpha: float, sigma: float, attention: str) -> float:
    """The smallest ``xi_ii`` any set of ``num_clients`` models can give (negative: ``u_i`` is no convex mix)."""
    if attention == "cosine":
        return 1.0 - alpha
    return 1.0 - alpha * (num_clients - 1) / sigma  # A' is at most 1/sigma, reached by identical models
