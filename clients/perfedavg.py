"""The Per-FedAvg client: ``local-steps`` meta-updates with step ``beta`` per round."""

from __future__ import annotations

import numpy as np
import torch

from clients.base import TorchClient
from clients.meta import axpy, check_meta_settings, meta_gradient, model_loss
from clients.settings import ClientSettings
from clients.training import TrainReport


class PerFedAvgClient(TorchClient):
    """Runs Per-FedAvg's local updates (ALGORITHMS.md section 1, seed eq. 7-8).

    Each of the ``local_steps`` (tau) updates draws three independent batches
    ``D``, ``D'``, ``D''`` of sizes ``batch_size``, ``outer_batch_size`` and
    ``hessian_batch_size`` from the client's training data (each without
    replacement; they may overlap one another), estimates the meta-gradient with
    ``variant`` and steps ``w <- w - beta * direction``. Evaluation is the shared
    personalised protocol (one step of size ``alpha`` by default).
    """

    def check_settings(self, settings: ClientSettings) -> None:
        check_meta_settings(
            alpha=settings.alpha,
            beta=settings.beta,
            delta=settings.delta,
            variant=settings.variant,
            batch_sizes={
                "batch-size": settings.batch_size,
                "outer-batch-size": settings.outer_batch_size,
                "hessian-batch-size": settings.hessian_batch_size,
            },
            num_examples=len(self.train_y),
        )

    def local_train(self, settings: ClientSettings, rng: np.random.Generator) -> TrainReport:
        loss_fn = model_loss(self.model)
        params = tuple(p.detach() for p in self.model.parameters())
        sizes = (settings.batch_size, settings.outer_batch_size, settings.hessian_batch_size)
        num = len(self.train_y)
        losses, grad_evals, hvp_evals, sample_grads = [], 0, 0, 0
        self.model.train()
        for _ in range(settings.local_steps):
            batches = tuple(self._batch(rng.choice(num, size, replace=False)) for size in sizes)
            step = meta_gradient(
                loss_fn, params, batches, alpha=settings.alpha, variant=settings.variant, delta=settings.delta
            )
            params = axpy(params, step.direction, -settings.beta)
            losses.append(step.outer_loss)
            grad_evals += step.grad_evals
            hvp_evals += step.hvp_evals
            # per-example gradients: D and D' once each; D'' twice for hf, once (as an HVP) for so
            sample_grads += sizes[0] + sizes[1] + {"fo": 0, "hf": 2, "so": 1}[settings.variant] * sizes[2]
        with torch.no_grad():
            for target, value in zip(self.model.parameters(), params, strict=True):
                target.copy_(value)
        return TrainReport(float(np.mean(losses)), settings.local_steps, grad_evals, sample_grads, hvp_evals)

    def _batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(idx, device=self.train_x.device)
        return self.train_x[index], self.train_y[index]
