"""FATHOM: FedAvg that tunes its client learning rate, epochs and batch size online (Kan, 2023)."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common import Scalar
from flwr.common.logger import log

from strategies.aggregation import flatten, weighted_average_inplace
from strategies.base import FederatedStrategy
from strategies.contracts.fathom import CONTRACT, PHI
from strategies.fathom_math import FathomState, RoundAggregate, fathom_update
from strategies.screening import Reply


class Fathom(FederatedStrategy):
    """FedAvg with FATHOM's online hyperparameter updates (ALGORITHMS.md section 2).

    Every round the values in force (``lr``, ``local-epochs`` = E and ``batch-size`` = B,
    all reals, starting from the shared keys) go to every sampled client in its fit
    config; models are averaged by example count; the aggregated update and the
    clients' ``phi`` give the normalised hypergradients, and :func:`fathom_update`
    moves the state. The record holds the values in force (``hp-*``), ``H``, ``G``,
    and the range of the ``lr`` the clients say they used.
    """

    contract = CONTRACT

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        training = self.settings.training
        self.tuning = FathomState(lr=training.lr, epochs=training.local_epochs, batch_size=float(training.batch_size))
        if self.settings.run.aggregation != "examples":
            log(WARNING, "fathom always weighs models by example count (its update rule assumes it)")

    def hyperparameters(self) -> dict[str, Scalar]:
        return {"lr": self.tuning.lr, "local-epochs": self.tuning.epochs, "batch-size": self.tuning.batch_size}

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        if not replies:
            return None, {}
        previous = flatten(self.global_model, np.float64)
        examples = [reply.num_examples for reply in replies]
        arrays = weighted_average_inplace([reply.arrays for reply in replies], examples)
        aggregate = RoundAggregate(
            update=flatten(arrays, np.float64) - previous, examples=np.array(examples, dtype=np.float64),
            phis=np.array([float(reply.metrics[PHI]) for reply in replies]),
        )
        self.tuning, hg = fathom_update(self.tuning, aggregate, self.method)
        received_lr = [float(reply.metrics.get("lr", np.nan)) for reply in replies]
        return arrays, {"H": hg.global_term, "G": hg.local_term, "phi-mean": float(np.mean(aggregate.phis)),
                        "client-lr-min": float(np.min(received_lr)), "client-lr-max": float(np.max(received_lr))}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The values in force, the update count and the smoothed update."""
        tuning = self.tuning
        scalars = {"lr": tuning.lr, "epochs": tuning.epochs, "batch-size": tuning.batch_size, "round": tuning.round}
        smoothed = tuning.smoothed_update
        return ({"fathom/smoothed-update": smoothed} if smoothed is not None else {}), scalars

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        self.tuning = FathomState(
            lr=float(state["lr"]), epochs=float(state["epochs"]), batch_size=float(state["batch-size"]),
            smoothed_update=arrays.get("fathom/smoothed-update"), round=int(state["round"]),
        )  # fmt: skip
