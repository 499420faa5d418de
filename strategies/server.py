"""Flower's server loop, with the one call it lacks: the strategy's ``end_round`` after every round."""

from __future__ import annotations

import time
from logging import WARNING

from flwr.common import Scalar
from flwr.common.logger import log
from flwr.server import Server
from flwr.server.client_manager import ClientManager
from flwr.server.history import History
from flwr.server.server import EvaluateResultsAndFailures

from strategies.base import FederatedStrategy, RunDivergedError
from strategies.resume import ContinuedRun


class RoundServer(Server):
    """Runs Flower's rounds unchanged and closes each one on the strategy once its evaluation is done.

    Flower's ``Server.fit`` runs fit, the server-side evaluation and the client
    evaluation of every round, and has no hook after the last of them; the record
    of a round is complete only then. The evaluation step runs every round (it
    returns early when no client is asked), so it is where the round ends.

    Parameters
    ----------
    client_manager
        Flower's client manager.
    strategy
        A stamen strategy, or one continued from a checkpoint.
    max_workers
        Messages kept in flight at once (Flower's default is CPUs + 4).

    """

    closes_rounds = True  # what a stamen strategy checks before round 1 (strategies.flower_api.refuse_plain_server)

    def __init__(
        self, *, client_manager: ClientManager, strategy: FederatedStrategy | ContinuedRun, max_workers: int
    ) -> None:
        super().__init__(client_manager=client_manager, strategy=strategy)
        self.set_max_workers(max_workers)

    def fit(self, num_rounds: int, timeout: float | None) -> tuple[History, float]:
        """Flower's rounds; a run that raises ends its results folder as failed, then raises on.

        A run the strategy stops early (:class:`RunDivergedError`, it diverged) ends normally: its
        results folder says why, and Flower reports the run as completed.
        """
        started = time.perf_counter()
        try:
            return super().fit(num_rounds, timeout)
        except RunDivergedError as stop:
            log(WARNING, "the run stopped early: %s", stop)
            return History(), time.perf_counter() - started
        except Exception as err:
            self.strategy.fail(" ".join(str(err).split()) or type(err).__name__)
            raise

    def evaluate_round(
        self, server_round: int, timeout: float | None
    ) -> tuple[float | None, dict[str, Scalar], EvaluateResultsAndFailures] | None:
        result = super().evaluate_round(server_round, timeout)
        self.strategy.end_round(server_round)
        return result
