"""The tuner's start probe: a few rounds that try the start step size on a log grid (pure numpy, no Flower).

A bad start is one a sign-following rule cannot leave: on FEMNIST's initial plateau
FATHOM's ``H``, a longer-window ``H`` and even the one-round change of the global loss
all call for a *smaller* step from lr 0.01 (ten times too small), because a model
trained a while at a small step sits where a larger one first does harm
(docs/benchmarks.md, B2). At the start they do not: from the initial model one round of
local training lowers the clients' loss most at the step size that tuned FedAvg chose.
So the probe asks at the start, before any sign is followed:

- for ``rounds`` rounds, the sampled clients are dealt to ``points`` slots in turn,
  slot ``k`` training with the step size in force times ``factor**(k - points // 2)``;
- each reply's local progress is ``rho = train-loss / start-loss``, the mean loss of its
  local steps against the loss of its first (the model as received, on its first batch),
  which makes writers of unequal difficulty comparable;
- the tuner then starts from the slot with the lowest mean ``rho``; a slot with a missing
  or rejected reply (a step that diverged) is never chosen, and with no usable slot the
  start value stays.

The global model of a probe round combines the middle slot's replies only, so the
probe's outsized steps never reach it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


def probe_factors(factor: float, points: int) -> np.ndarray:
    """The multipliers tried: ``factor**k`` for ``k = -(points // 2) .. points // 2``."""
    return factor ** (np.arange(points, dtype=np.float64) - points // 2)


def probe_slots(partitions: list[int], server_round: int, points: int) -> dict[int, int]:
    """Each sampled partition's slot in a probe round: in sampling order, rotated by the round."""
    return {partition: (i + server_round) % points for i, partition in enumerate(partitions)}


def local_progress(train_loss: float, start_loss: float) -> float:
    """``train_loss / start_loss``; nan when either is missing, not finite, or the start loss is not positive."""
    if not (math.isfinite(train_loss) and math.isfinite(start_loss)) or start_loss <= 0:
        return math.nan
    return train_loss / start_loss


@dataclass(frozen=True, eq=False)
class ProbeTally:
    """Per slot: the sum and count of ``rho``, and whether a reply of the slot went missing."""

    sums: np.ndarray
    counts: np.ndarray
    failed: np.ndarray
    rounds: int = 0

    @classmethod
    def empty(cls, points: int) -> ProbeTally:
        return cls(np.zeros(points), np.zeros(points, dtype=np.int64), np.zeros(points, dtype=bool))

    def means(self) -> np.ndarray:
        """Mean ``rho`` per slot (nan where the slot has none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)


def tallied(tally: ProbeTally, slots: dict[int, int], progress: dict[int, float]) -> ProbeTally:
    """``tally`` after one probe round: ``progress`` maps each accepted reply's partition to its ``rho``.

    A partition dealt a slot without an accepted reply, or whose reply had no usable ``rho``,
    marks the slot failed.
    """
    sums, counts, failed = tally.sums.copy(), tally.counts.copy(), tally.failed.copy()
    for partition, slot in slots.items():
        rho = progress.get(partition, math.nan)
        if math.isfinite(rho):
            sums[slot] += rho
            counts[slot] += 1
        else:
            failed[slot] = True
    return replace(tally, sums=sums, counts=counts, failed=failed, rounds=tally.rounds + 1)


def probe_choice(tally: ProbeTally) -> int:
    """The slot to start from: the lowest mean ``rho`` among slots with replies and no failure; else the middle."""
    middle = len(tally.counts) // 2
    means = tally.means()
    usable = [k for k in range(len(means)) if tally.counts[k] > 0 and not tally.failed[k]]
    if not usable:
        return middle
    return min(usable, key=lambda k: (means[k], abs(k - middle)))
