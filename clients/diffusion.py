"""The diffusion agent: T local SGD steps of size ``mu`` from the model the server holds for it."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.settings import ClientSettings
from clients.training import TrainReport, batch_indices, sgd_steps


class DiffusionClient(TorchClient):
    """One agent of asynchronous diffusion (ALGORITHMS.md section 3).

    The server sends this agent its own model ``w_k`` with ``mu`` and
    ``local-steps`` (T) in the fit config; the agent runs T SGD steps of size
    ``mu`` on mini-batches of ``batch-size`` of its own data and returns ``psi_k``.
    The combination with its neighbours happens on the server. Evaluation is the
    agent's own model on its own test split (the server sends ``adapt-steps = 0``).
    """

    def local_train(self, settings: ClientSettings, rng: np.random.Generator) -> TrainReport:
        num = len(self.train_y)
        batches = batch_indices(num, settings.batch_size, settings.local_steps, rng)
        return sgd_steps(self.model, self.train_x, self.train_y, batches, settings.mu)
