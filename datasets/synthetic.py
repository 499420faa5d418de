"""Synthetic(alpha, beta) of the FedProx paper (Li et al., 2020, Section 5.1).

Device k draws ``u_k ~ N(0, alpha)`` and ``B_k ~ N(0, beta)``; its softmax model
``W_k ~ N(u_k, 1)`` (60 x 10), ``b_k ~ N(u_k, 1)``; its inputs
``x ~ N(v_k, Sigma)`` with ``v_k ~ N(B_k, 1)`` and ``Sigma = diag(j^-1.2)``; labels
``y = argmax(softmax(W_k^T x + b_k))``. ``alpha`` controls how much the local models
differ, ``beta`` how much the local inputs differ. Sample counts per device follow
the reference code's ``lognormal(4, 2) + 50``, capped at ``MAX_SAMPLES`` so one
device cannot hold tens of thousands of rows. As in the reference code, ``alpha``
and ``beta`` are used as standard deviations.
"""

from __future__ import annotations

import numpy as np

from datasets.base import ArraySource

DIMENSION = 60
NUM_CLASSES = 10
MAX_SAMPLES = 2000


def make_synthetic(*, alpha: float, beta: float, num_users: int, seed: int) -> ArraySource:
    """Generate one device per user; each device's rows form its natural group."""
    rng = np.random.default_rng(seed)
    counts = np.minimum(rng.lognormal(4, 2, num_users).astype(int) + 50, MAX_SAMPLES)
    model_means = rng.normal(0.0, alpha, num_users)
    input_shifts = rng.normal(0.0, beta, num_users)
    scale = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -0.6  # sqrt of j^-1.2
    xs, ys, groups, start = [], [], [], 0
    for user in range(num_users):
        weights = rng.normal(model_means[user], 1.0, (DIMENSION, NUM_CLASSES))
        bias = rng.normal(model_means[user], 1.0, NUM_CLASSES)
        centre = rng.normal(input_shifts[user], 1.0, DIMENSION)
        x = centre + rng.standard_normal((counts[user], DIMENSION)) * scale
        ys.append(np.argmax(x @ weights + bias, axis=1))  # softmax is monotone
        xs.append(x.astype(np.float32))
        groups.append(np.arange(start, start + counts[user]))
        start += counts[user]
    return ArraySource(
        name="synthetic",
        train_x=np.concatenate(xs),
        train_y=np.concatenate(ys).astype(np.int64),
        test_x=np.zeros((0, DIMENSION), dtype=np.float32),
        test_y=np.zeros(0, dtype=np.int64),
        num_classes=NUM_CLASSES,
        train_groups=tuple(groups),
    )
