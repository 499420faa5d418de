"""Which clients a round asks: a function of the seed, the round and the partitions connected (pure numpy).

Flower's own strategies sample nodes with Python's unseeded global ``random``
(``flwr/serverapp/strategy/strategy_utils.py``), so two runs of one config sample
different clients (flwr issue 3328). Here a round's sample depends
on ``(seed, round, purpose)`` and the sorted partition ids of the connected nodes
only: the same config and seed sample the same clients, and a resumed run samples
what the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

PURPOSES = ("fit", "evaluate")


def sample_size(available: int, fraction: float, minimum: int) -> int:
    """``max(int(available * fraction), minimum)``, as Flower's FedAvg sizes a sample, capped at ``available``."""
    return min(max(int(available * fraction), minimum), available)


def sample_partitions(
    partitions: Collection[int], size: int, *, seed: int, server_round: int, purpose: str
) -> list[int]:
    """``size`` distinct partitions drawn uniformly from ``partitions``, in increasing order.

    Parameters
    ----------
    partitions
        The partition ids of the connected nodes (their order does not matter).
    size
        How many to draw (at most ``len(partitions)``).
    seed, server_round, purpose
        The draw's seed: the run's seed, the round and ``fit`` or ``evaluate``.

    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r} is not one of {list(PURPOSES)}")
    ordered = sorted(partitions)
    if not 0 <= size <= len(ordered):
        raise ValueError(f"cannot draw {size} of {len(ordered)} partitions")
    rng = np.random.default_rng([seed, server_round, PURPOSES.index(purpose)])
    return sorted(ordered[i] for i in rng.choice(len(ordered), size=size, replace=False))
