"""The divergence watch: consecutive rounds whose replies or losses were all non-finite, and the last good model.

A member of every strategy (``strategy.divergence``). Each round's record is handed to
:meth:`DivergenceWatch.observe` with the model that round sent; after
``stop-after-nonfinite`` bad rounds in a row it returns a :class:`Diverged` verdict, and
the strategy stops the run with the last good model (:mod:`strategies.rounds.run_watch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Diverged:
    """Why and where the run stops: its bad rounds, what was bad, and the last model known good."""

    first_round: int
    last_round: int
    what: str
    good_round: int
    good_model: list[np.ndarray]


def round_is_nonfinite(record: dict) -> tuple[bool, str]:
    """Whether the round's record says it diverged, and how (``every fit reply ...`` or ``no evaluation loss ...``).

    A round is non-finite when no fit reply was accepted and some were rejected for
    non-finite values, or when it evaluated and no loss was finite (the clients' or the server's).
    """
    fit_bad = record.get("clients-succeeded", 0) == 0 and record.get("clients-nonfinite", 0) > 0
    evaluated = record.get("eval-clients", 0) + record.get("eval-clients-nonfinite", 0) > 0
    eval_bad = evaluated and record.get("eval-clients", 0) == 0
    central = record.get("central-loss")
    central_bad = isinstance(central, float) and not np.isfinite(central)
    what = "every fit reply was non-finite" if fit_bad else "no evaluation loss was finite"
    return fit_bad or eval_bad or central_bad, what


class DivergenceWatch:
    """Counts consecutive non-finite rounds; keeps the model sent before the last good round.

    Parameters
    ----------
    patience
        ``stop-after-nonfinite``: stop after this many bad rounds in a row (0: never).
    initial_model
        The model before round 1, good until a round says otherwise.

    """

    def __init__(self, *, patience: int, initial_model: list[np.ndarray]) -> None:
        self.patience = patience
        self.nonfinite_rounds = 0
        self.last_good: tuple[int, list[np.ndarray]] = (0, initial_model)  # (the round it is the model after, arrays)

    def observe(self, server_round: int, record: dict, sent_model: list[np.ndarray]) -> Diverged | None:
        """Take the round's record and the model it sent; the verdict when the run must stop, else ``None``."""
        bad, what = round_is_nonfinite(record)
        if not bad:
            self.nonfinite_rounds = 0
            self.last_good = (server_round - 1, sent_model)  # the model it sent came back finite
            return None
        self.nonfinite_rounds += 1
        if not self.patience or self.nonfinite_rounds < self.patience:
            return None
        good_round, good_model = self.last_good
        return Diverged(first_round=server_round - self.nonfinite_rounds + 1, last_round=server_round, what=what,
                        good_round=good_round, good_model=good_model)  # fmt: skip
