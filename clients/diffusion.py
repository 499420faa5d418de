"""The diffusion agent: T local SGD steps of size ``diffusion-mu`` from the model the server holds for it."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.diffusion import CONTRACT, DiffusionSettings


class DiffusionClient(TorchClient):
    """One agent of asynchronous diffusion (ALGORITHMS.md section 3).

    The server sends this agent its own model ``w_k`` with ``diffusion-mu`` and
    ``local-steps`` (T) in the fit config; the agent runs T SGD steps of size mu on
    mini-batches of ``batch-size`` of its own data and returns ``psi_k``. The
    combination with its neighbours happens on the server. Evaluation is the agent's
    own model on its own test split (the server sends ``adapt-steps = 0``).
    """

    contract = CONTRACT

    def local_train(
        self, training: TrainingSettings, method: DiffusionSettings, rng: np.random.Generator
    ) -> TrainReport:
        return self.local_sgd(training, rng, lr=method.mu, steps=training.local_steps)
