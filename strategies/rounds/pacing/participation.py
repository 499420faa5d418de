"""Each device's share of the applied updates, and the correction that undoes it (pure numpy).

Under asynchrony a device's weight in the limit is its participation ``q_k``: the diffusion
seed's iterates converge to ``argmin sum_k p_k q_k J_k`` (ALGORITHMS.md section 3), and a
buffered FedAvg's to ``argmin sum_k q_k J_k``. The server measures ``q_hat_k``, device k's
share of the replies applied so far, and ``q_eff_k``, its share of the applied weight
(each reply counted by its staleness weight, which scales its step); the correction ``inverse-participation`` weights
device k's update by ``b_k = (1/N) / q_eff_k``, clipped to ``[1/CLIP, CLIP]``, so that
``q_k b_k`` is uniform in the limit. ``q_hat`` is smoothed (one pseudo-count per device)
so that a device's first reply is not weighted by ``N``.
"""

from __future__ import annotations

from collections import Counter

from strategies.contracts.common import CORRECTIONS

CLIP = 10.0  # the most one device's update is scaled up (or down): a device seen once is not weighted N times


class Participation:
    """Counts of applied replies per device; their shares and the correction weights.

    Parameters
    ----------
    partitions
        Every device of the fleet (those never applied count too).
    correction
        ``none`` or ``inverse-participation``.

    """

    def __init__(self, *, partitions: list[int], correction: str = "none") -> None:
        if correction not in CORRECTIONS:
            raise ValueError(f"participation correction {correction!r} is not one of {list(CORRECTIONS)}")
        self.partitions = sorted(partitions)
        self.correction = correction
        self.applied: Counter[int] = Counter()
        self.weights: Counter[int] = Counter()  # the staleness weights their replies were applied with
        self.staleness: dict[int, list[int]] = {}

    def add(self, partition: int, tau: int, *, weight: float = 1.0) -> None:
        """One reply of ``partition``, ``tau`` updates stale, applied with staleness weight ``weight``."""
        self.applied[partition] += 1
        self.weights[partition] += weight
        self.staleness.setdefault(partition, []).append(tau)

    @property
    def total(self) -> int:
        return sum(self.applied.values())

    def shares(self) -> dict[int, float]:
        """``q_hat_k``: each device's share of the replies applied so far (0 before any)."""
        total = self.total
        return {p: self.applied[p] / total if total else 0.0 for p in self.partitions}

    def effective_shares(self) -> dict[int, float]:
        """Each device's share of the applied weight: its replies counted by their staleness weights.

        The limit weighs device k by this (a stale reply moves the model less); it is what
        the correction evens out.
        """
        total = sum(self.weights.values())
        return {p: self.weights[p] / total if total else 0.0 for p in self.partitions}

    def weight(self, partition: int) -> float:
        """``b_k``: 1 without a correction; else ``(1/N) / q_eff_k`` (the effective share), smoothed and clipped."""
        if self.correction == "none":
            return 1.0
        n = len(self.partitions)
        total = sum(self.weights.values())
        mean = total / self.total if self.total else 1.0  # a pseudo-reply per device, of the mean weight
        smoothed = (self.weights[partition] + mean) / (total + n * mean)
        return min(max((1.0 / n) / smoothed, 1.0 / CLIP), CLIP)

    def report(self) -> dict[str, object]:
        """Per device: applied replies, share and mean staleness (``participation.json``)."""
        shares = self.shares()
        return {"correction": self.correction, "applied": self.total,
                "devices": {str(p): {"applied": self.applied[p], "share": shares[p],
                                     "staleness-mean": (sum(self.staleness[p]) / len(self.staleness[p])
                                                        if self.staleness.get(p) else None)}
                            for p in self.partitions}}  # fmt: skip
