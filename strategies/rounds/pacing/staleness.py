"""Staleness weights and the rebase that lets a method's own combination take stale replies (pure numpy).

A buffered asynchronous server (FedBuff, Nguyen et al., AISTATS 2022) applies
``w <- w + eta_g * (1/B) * sum_j s(tau_j) * Delta_j``, ``Delta_j`` device j's update from the
model it was sent, ``tau_j`` the server updates since then, ``s(tau) = 1 / sqrt(1 + tau)``.
stamen keeps each method's combination (its aggregation rule, robust ones included) and hands
it every reply *rebased* onto the newest model: ``w + c_j * (w_j - w_sent_j)`` with
``c_j = eta_g * s(tau_j) * b_j`` (``b_j`` the participation correction, 1 without one). A
uniform mean of the rebased replies is then exactly FedBuff's update; with ``tau = 0``,
``c = 1`` a rebased reply is the reply itself.
"""

from __future__ import annotations

import numpy as np

from strategies.contracts.common import STALENESS_RULES


def staleness_weight(tau: int, rule: str = "sqrt") -> float:
    """``s(tau)``: ``1 / sqrt(1 + tau)`` (``sqrt``, FedBuff's) or ``1`` (``none``)."""
    if tau < 0:
        raise ValueError(f"staleness must be >= 0, got {tau}")
    if rule == "sqrt":
        return 1.0 / float(np.sqrt(1.0 + tau))
    if rule == "none":
        return 1.0
    raise ValueError(f"staleness rule {rule!r} is not one of {list(STALENESS_RULES)}")


def rebase(newest: list[np.ndarray], sent: list[np.ndarray], reply: list[np.ndarray], weight: float,
           floating: list[bool]) -> list[np.ndarray]:  # fmt: skip
    """``newest + weight * (reply - sent)`` for each floating array; the newest value for the others (counters).

    Computed in float64 and cast back to each array's dtype, so a rebase with weight 1 onto
    the model the reply was trained from returns the reply exactly.
    """
    if not len(newest) == len(sent) == len(reply) == len(floating):
        raise ValueError("rebase: newest, sent, reply and floating must have one entry per array")
    out = []
    for now, then, got, is_float in zip(newest, sent, reply, floating, strict=True):
        if not is_float:
            out.append(now)
            continue
        if weight == 1.0 and now is then:
            out.append(got)
            continue
        moved = now.astype(np.float64) + weight * (got.astype(np.float64) - then.astype(np.float64))
        out.append(moved.astype(got.dtype))
    return out
