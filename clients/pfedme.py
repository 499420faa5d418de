"""The pFedMe client: a personal model solving a proximal problem around the local model, each local step."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from clients.base import TorchClient
from clients.batches import Batch, round_batches
from clients.losses import LossFn, Params, axpy, gradient, model_loss, proximal_term
from clients.training import TrainReport, write_parameters
from strategies.contracts.common import TrainingSettings
from strategies.contracts.pfedme import CONTRACT, PERSONAL_DISTANCE, PFedMeSettings

PERSONAL = "personal-model"  # theta_k, in Context.state


def pfedme_local_rounds(
    loss_fn: LossFn, w: Params, batches: Iterable[Batch], *, lam: float, lr: float, personal_lr: float, inner_steps: int
) -> tuple[Params, Params, list[torch.Tensor]]:
    """The local work of pFedMe's Algorithm 1 from ``w``: the local model ``w_k``, the personal ``theta_k``, losses.

    For every batch D: ``inner_steps`` steps ``theta <- theta - personal_lr (grad f(theta; D) +
    lam (theta - w_k))`` from the current ``theta`` (``w`` at first), then ``w_k <- w_k - lr
    lam (w_k - theta)``. The losses are ``f(theta; D)`` before each inner step.
    """
    theta, losses = w, []
    for batch in batches:
        for _ in range(inner_steps):
            grads, loss = gradient(loss_fn, theta, batch, proximal_term(w, lam))
            theta = axpy(theta, grads, -personal_lr)
            losses.append(loss)
        w = axpy(w, [wi - ti for wi, ti in zip(w, theta, strict=True)], -lr * lam)
    return w, theta, losses


class PFedMeClient(TorchClient):
    """pFedMe's client work: ``local-steps`` (R) local rounds, each on a fresh batch of ``batch-size``.

    Returns the local model ``w_k`` and keeps the personal model ``theta_k`` in
    ``Context.state``; evaluation tests ``theta_k`` as it is (a client never sampled has
    none and tests the model received). ``train-loss`` is the mean of ``f(theta; D)`` over
    the inner steps; each local round costs ``pfedme-inner-steps`` gradient evaluations;
    ``pfedme-personal-distance`` is ``||theta_k - w_k||`` at the end.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: PFedMeSettings, rng: np.random.Generator) -> TrainReport:
        num = len(self.train_y)
        rounds, batches = round_batches(self.train_x, self.train_y, training, rng)
        start = tuple(p.detach() for p in self.model.parameters())
        self.model.train()
        w, theta, losses = pfedme_local_rounds(model_loss(self.model), start, batches, lam=method.lambda_,
                                               lr=training.lr, personal_lr=method.personal_lr,
                                               inner_steps=method.inner_steps)  # fmt: skip
        write_parameters(self.model.parameters(), theta)
        self.state.set_arrays(PERSONAL, self.get_parameters({}))
        write_parameters(self.model.parameters(), w)
        grad_evals = rounds * method.inner_steps
        mean = float(torch.stack(losses).double().mean())
        distance = float(torch.sqrt(sum(((t - v) ** 2).sum() for t, v in zip(theta, w, strict=True))))
        return TrainReport(mean, rounds, grad_evals, grad_evals * min(training.batch_size, num),
                           extra={PERSONAL_DISTANCE: distance})  # fmt: skip

    def personal_model(self, training: TrainingSettings, method: PFedMeSettings) -> list[np.ndarray] | None:
        """``theta_k``, tested beside the model received; a client never sampled has none yet."""
        return self.state.arrays(PERSONAL)
