"""The FATHOM client: batch size and steps from the broadcast values, and the local alignment ``phi``."""

from __future__ import annotations

import math

import numpy as np
import torch

from clients.base import TorchClient
from clients.settings import ClientSettings
from clients.training import TrainReport, batch_indices, task_loss

PHI = "phi"
USED_BATCH = "used-batch-size"


def client_plan(num_examples: int, epochs: float, batch_size: float) -> tuple[int, int]:
    """Batch size ``b = clip(round(B), 1, nu)`` and steps ``K = max(1, ceil(nu * E / b))`` (ALGORITHMS.md)."""
    if num_examples < 1:
        raise ValueError(f"a client needs at least one example, got {num_examples}")
    batch = int(min(max(round(batch_size), 1), num_examples))
    return batch, max(1, math.ceil(num_examples * epochs / batch))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine in [-1, 1] (clamped against rounding); 0 where either norm is 0."""
    norm = float(a.norm()) * float(b.norm())
    return min(1.0, max(-1.0, float(torch.dot(a, b)) / norm)) if norm > 0 else 0.0


class FathomClient(TorchClient):
    """Runs ``K`` SGD steps of size ``lr`` with the batch size FATHOM broadcast, and reports ``phi``.

    The server sends ``lr``, ``local-epochs`` (E, real) and ``batch-size`` (B, real;
    the settings hold its nearest integer) in the fit config; this client turns them
    into its own batch size and number of steps with :func:`client_plan`, tracks
    ``phi`` as it goes (one running sum of the gradients, no history kept), and
    returns ``phi`` and the batch size it used besides the shared metrics (steps,
    per-example gradients).
    """

    def local_train(self, settings: ClientSettings, rng: np.random.Generator) -> TrainReport:
        num = len(self.train_y)
        batch, steps = client_plan(num, settings.local_epochs, settings.batch_size)
        params = tuple(self.model.parameters())
        self.model.train()
        losses, running, phi = [], None, math.inf
        for idx in batch_indices(num, batch, steps, rng):
            index = torch.as_tensor(idx, device=self.train_x.device)
            loss = task_loss(self.model(self.train_x[index]), self.train_y[index])
            grads = torch.autograd.grad(loss, params)
            flat = torch.cat([g.reshape(-1) for g in grads])
            running = flat.clone() if running is None else running + flat
            phi = min(phi, _cosine(flat, running))
            with torch.no_grad():
                for param, grad in zip(params, grads, strict=True):
                    param.sub_(settings.lr * grad)
            losses.append(loss.item())
        # what this client received and used, so a run's records show the broadcast arriving
        extra = {PHI: phi, USED_BATCH: batch, "lr": settings.lr, "local-epochs": settings.local_epochs}
        return TrainReport(float(np.mean(losses)), steps, steps, steps * batch, extra=extra)
