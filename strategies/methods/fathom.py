"""FATHOM: FedAvg that tunes its client learning rate, epochs and batch size online (Kan, 2023)."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import weighted_average_inplace
from strategies.base import FederatedStrategy
from strategies.contracts.fathom import CONTRACT, FathomSettings
from strategies.contracts.payload import Scalar
from strategies.screening.replies import Reply


class FathomServer(FederatedStrategy):
    """FedAvg with FATHOM's online hyperparameter updates (ALGORITHMS.md section 2).

    The tuner part (:class:`strategies.tuning.tuner.FathomTuner`, which ``tune = "fathom"`` puts
    over other methods) moves ``lr``, ``local-epochs`` = E and ``batch-size`` = B, all
    reals, starting from the shared keys, and every sampled client gets the values in
    force in its fit config; models are averaged by example count; the aggregated update
    and the clients' ``phi`` give the normalised hypergradients. The record holds the
    values in force (``hp-*``), ``H``, ``G``, ``phi-mean`` and the range of the ``lr``
    the clients say they used (``client-lr-min``, ``-max``: the contract's summary of their ``lr``).
    """

    contract = CONTRACT

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if self.settings.run.aggregation != "examples":
            log(WARNING, "fathom always weighs models by example count (its update rule assumes it)")

    def tuning(self) -> FathomSettings:
        """FATHOM is the tuner over FedAvg: its own settings (``fathom-*``) drive it."""
        return self.method

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        if not replies:
            return None, {}
        return weighted_average_inplace([reply.arrays for reply in replies], [r.num_examples for r in replies]), {}
