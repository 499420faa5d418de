"""The FedBN client: FedAvg's local SGD; its BatchNorm layers are kept in ``Context.state`` by the base."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedbn import CONTRACT, FedBNSettings


class FedBNClient(TorchClient):
    """Local SGD on the whole model; the base merges the kept BatchNorm arrays before and keeps them after."""

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FedBNSettings, rng: np.random.Generator) -> TrainReport:
        return self.local_sgd(training, rng)
