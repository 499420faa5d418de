"""The FedProx client: local SGD with the proximal term ``mu/2 ||w - w_global||^2`` added to the loss."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.losses import proximal_term
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedprox import CONTRACT, FedProxSettings


class FedProxClient(TorchClient):
    """Runs FedAvg's local SGD from the global model ``w^t``, each step on ``F_k(w) + mu/2 ||w - w^t||^2``.

    The reported training loss is ``F_k``'s alone; with ``fedprox-mu = 0`` the steps are
    FedAvg's, bit for bit.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FedProxSettings, rng: np.random.Generator) -> TrainReport:
        received = tuple(p.detach().clone() for p in self.model.parameters())  # w^t, before any local step
        return self.local_sgd(training, rng, extra_loss=proximal_term(received, method.mu))
