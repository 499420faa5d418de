"""The FATHOM client: batch size and steps from the broadcast values, and the local alignment ``phi``."""

from __future__ import annotations

import math

import numpy as np

from clients.base import TorchClient
from clients.training import Alignment, TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fathom import CONTRACT, PHI, USED_BATCH, FathomSettings


def client_plan(num_examples: int, epochs: float, batch_size: float) -> tuple[int, int]:
    """Batch size ``b = clip(round(B), 1, nu)`` and steps ``K = max(1, ceil(nu * E / b))`` (ALGORITHMS.md)."""
    if num_examples < 1:
        raise ValueError(f"a client needs at least one example, got {num_examples}")
    batch = int(min(max(round(batch_size), 1), num_examples))
    return batch, max(1, math.ceil(num_examples * epochs / batch))


class FathomClient(TorchClient):
    """Runs ``K`` SGD steps of size ``lr`` with the batch size FATHOM broadcast, and reports ``phi``.

    The server sends ``lr``, ``local-epochs`` (E, real) and ``batch-size`` (B, real; the
    round's settings hold its nearest integer) in the fit config; this client turns
    them into its own batch size and number of steps with :func:`client_plan`, tracks
    ``phi`` as it goes, and returns ``phi`` and the batch size it used besides the
    shared metrics.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FathomSettings, rng: np.random.Generator) -> TrainReport:
        batch, steps = client_plan(len(self.train_y), training.local_epochs, training.batch_size)
        alignment = Alignment()
        report = self.local_sgd(training, rng, steps=steps, batch_size=batch, on_step=alignment)
        # what this client received and used, so a run's records show the broadcast arriving
        extra = {PHI: alignment.phi, USED_BATCH: batch, "lr": training.lr, "local-epochs": training.local_epochs}
        return TrainReport(report.mean_loss, report.steps, report.grad_evals, report.sample_grads, extra=extra,
                           first_loss=report.first_loss)  # fmt: skip
