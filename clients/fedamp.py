"""The FedAMP client: local SGD from its cloud model ``u_i``, pulled towards it by a proximal term."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.losses import proximal_term
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedamp import CONTRACT, FedAmpSettings


class FedAmpClient(TorchClient):
    """Local SGD on ``F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2``, starting at the ``u_i`` it received.

    The paper's client solves that problem; it starts here from ``u_i`` (PFLlib's client
    starts from its own last model instead, which stamen's server holds, not the client).
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FedAmpSettings, rng: np.random.Generator) -> TrainReport:
        cloud = tuple(p.detach().clone() for p in self.model.parameters())  # u_i, before any local step
        return self.local_sgd(training, rng, extra_loss=proximal_term(cloud, method.lambda_ / method.alpha_k))
