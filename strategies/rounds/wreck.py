"""The wreck watch: a run that goes on without learning says so instead of ending ``completed``.

Two signs, each enough (issue 71): for ``wreck-rounds`` rounds in a row fewer than half of
the sampled replies were accepted (the screen rejecting the honest replies of a model walked
away by attackers, or devices failing), or the run ends with every accuracy it tested at the
majority-class floor (what a model predicting one class scores). A run with either ends with
``status`` ``wrecked``, naming the cause, the rounds and what to try.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FLOOR_MARGIN = 0.01  # an accuracy this close to the floor is at it
HINT = ("under attack, a robust aggregation (docs/robustness.md: multi-krum, centered-clip, bucket-size); "
        "otherwise lower the step sizes or check the data")  # fmt: skip


@dataclass(frozen=True)
class Wrecked:
    """Why the run is wrecked: the cause in words and the rounds it covers."""

    cause: str
    first_round: int
    last_round: int

    @property
    def reason(self) -> str:
        """The line ``summary.json`` and the log carry."""
        return f"wrecked: in rounds {self.first_round}-{self.last_round} {self.cause}; try {HINT}"


class WreckWatch:
    """Counts consecutive rounds that accepted fewer than half their sampled replies.

    Parameters
    ----------
    patience
        ``wreck-rounds``: the verdict after this many such rounds in a row (0: never), and the
        rounds a run needs before its final accuracy is held against the floor.

    """

    def __init__(self, *, patience: int) -> None:
        self.patience = patience
        self.streak = 0

    def observe(self, server_round: int, record: Mapping[str, object]) -> Wrecked | None:
        """Take the round's record; the verdict once ``patience`` starved rounds came in a row, else ``None``."""
        sampled = int(record.get("clients-sampled", 0) or 0)
        accepted = int(record.get("clients-succeeded", 0) or 0)
        self.streak = self.streak + 1 if sampled and 2 * accepted < sampled else 0
        if not self.patience or self.streak < self.patience:
            return None
        return Wrecked(f"fewer than half of the sampled replies were accepted (last: {accepted} of {sampled})",
                       server_round - self.streak + 1, server_round)  # fmt: skip

    def at_the_end(self, history: list[Mapping[str, object]], floor: float | None,
                   accuracy_keys: Iterable[str]) -> Wrecked | None:  # fmt: skip
        """The verdict for a run that ends with every tested accuracy at ``floor`` (after ``patience`` rounds)."""
        if not self.patience or floor is None or len(history) < self.patience:
            return None
        last = next((r for r in reversed(history) if any(k in r for k in accuracy_keys)), None)
        tested = {k: float(last[k]) for k in accuracy_keys if last is not None and k in last}
        if not tested or any(value > floor + FLOOR_MARGIN for value in tested.values()):
            return None
        shown = ", ".join(f"{k} {v:.4f}" for k, v in tested.items())
        return Wrecked(f"the run ended at the majority-class floor ({shown}; a model predicting the most common "
                       f"class scores {floor:.4f})", int(last.get("round", len(history))),
                       int(history[-1].get("round", len(history))))  # fmt: skip


def majority_floor(class_counts: Iterable[Mapping[int, int] | None]) -> float | None:
    """The accuracy of always answering the most common class, over the pooled counts (``None``: none known)."""
    pooled: dict[int, int] = {}
    for counts in class_counts:
        for label, count in (counts or {}).items():
            pooled[label] = pooled.get(label, 0) + int(count)
    total = sum(pooled.values())
    return max(pooled.values()) / total if total else None
