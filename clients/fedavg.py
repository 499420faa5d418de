"""The FedAvg client: local SGD from the global model with the shared ``lr``, ``batch-size`` and steps."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.contract import MethodSettings
from strategies.contracts.fedavg import CONTRACT


class FedAvgClient(TorchClient):
    """Runs ``local-steps`` (or ``local-epochs`` passes of) SGD with step ``lr`` on batches of ``batch-size``."""

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: MethodSettings, rng: np.random.Generator) -> TrainReport:
        return self.local_sgd(training, rng)
