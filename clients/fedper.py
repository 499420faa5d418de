"""The FedPer client: local SGD on the body it received and the head it keeps."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedper import CONTRACT, FedPerSettings


class FedPerClient(TorchClient):
    """Trains its whole model with the shared ``lr``, ``batch-size`` and steps; only the body leaves it.

    The base client puts the head kept in ``Context.state`` under the body received before
    this runs, and keeps the trained head afterwards (``fedper-personal-layers``).
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FedPerSettings, rng: np.random.Generator) -> TrainReport:
        return self.local_sgd(training, rng)
