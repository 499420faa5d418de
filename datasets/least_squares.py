"""A convex problem for the diffusion theory checks: per-agent least squares (pure numpy).

Agent k has its own true parameter ``w_k = w_c + alpha * N(0, I)`` around a common
``w_c ~ N(0, I)``, inputs ``x ~ N(beta * m_k, diag(s_k)^2)`` with ``m_k ~ N(0, I)``
and scales ``s_k ~ U(0.5, 1.5)^d``, and targets ``y = x . w_k + 0.1 * N(0, 1)``. Its
risk is ``J_k(w) = 1/(2 N_k) ||X_k w - y_k||^2``. ``alpha`` makes the agents'
minimisers differ, ``beta`` their input distributions, so the minimiser of a
weighted sum of the ``J_k`` moves measurably with the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from datasets.base import ArraySource

DIMENSION = 10
TRAIN_PER_AGENT, TEST_PER_AGENT = 200, 100
NOISE = 0.1


def make_least_squares(*, alpha: float, beta: float, num_users: int, seed: int) -> ArraySource:
    """One agent per user; rows are grouped by agent (the ``natural`` split), targets float32."""
    if num_users < 1:
        raise ValueError(f"least-squares needs at least one agent, got {num_users}")
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(DIMENSION)
    parts: dict[str, list[np.ndarray]] = {"train_x": [], "train_y": [], "test_x": [], "test_y": []}
    for _ in range(num_users):
        truth = common + alpha * rng.standard_normal(DIMENSION)
        centre = beta * rng.standard_normal(DIMENSION)
        scale = rng.uniform(0.5, 1.5, DIMENSION)
        for split, count in (("train", TRAIN_PER_AGENT), ("test", TEST_PER_AGENT)):
            x = centre + scale * rng.standard_normal((count, DIMENSION))
            parts[f"{split}_x"].append(x.astype(np.float32))
            parts[f"{split}_y"].append((x @ truth + NOISE * rng.standard_normal(count)).astype(np.float32))
    groups = {
        split: tuple(np.arange(k * count, (k + 1) * count) for k in range(num_users))
        for split, count in (("train", TRAIN_PER_AGENT), ("test", TEST_PER_AGENT))
    }
    return ArraySource(
        name="least-squares",
        **{key: np.concatenate(value) for key, value in parts.items()},
        num_classes=0,
        train_groups=groups["train"],
        test_groups=groups["test"],
    )


def least_squares_optimum(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``argmin_w sum_k weights_k J_k(w)`` with ``J_k(w) = 1/(2 N_k) ||X_k w - y_k||^2``, in float64.

    Uniform weights give the plain-average optimum; ``p_bar_k q_k`` gives the point
    asynchronous diffusion converges to (ALGORITHMS.md section 3).
    """
    dim = xs[0].shape[1]
    hessian, rhs = np.zeros((dim, dim)), np.zeros(dim)
    for x, y, weight in zip(xs, ys, weights, strict=True):
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        hessian += weight * x64.T @ x64 / len(y64)
        rhs += weight * x64.T @ y64 / len(y64)
    return np.linalg.solve(hessian, rhs)
