"""The APFL client: the global model's local copy and a model of its own, mixed by a learnt weight."""

from __future__ import annotations

import numpy as np
import torch

from clients.base import TorchClient
from clients.batches import Batch, round_batches
from clients.losses import LossFn, Params, axpy, gradient, model_loss
from clients.training import TrainReport, write_parameters
from strategies.contracts.apfl import CONTRACT, MIXING, PERSONAL_LOSS, ApflSettings
from strategies.contracts.common import TrainingSettings

LOCAL_MODEL = "local-model"  # v_k (every array of the model), in Context.state; alpha_k beside it as a scalar


def apfl_step(
    loss_fn: LossFn, w: Params, v: Params, alpha: torch.Tensor, batch: Batch, *, lr: float, alpha_lr: float
) -> tuple[Params, Params, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One APFL local step (Algorithm 1), every update from the values before it.

    ``w <- w - lr grad F(w)``; with ``vbar = alpha v + (1 - alpha) w``, ``v <- v - lr alpha
    grad F(vbar)`` (the gradient of ``F(vbar)`` in ``v``) and ``alpha <- clip(alpha -
    alpha_lr <v - w, grad F(vbar)>, 0, 1)`` (its gradient in ``alpha``). Returns the new
    ``w``, ``v``, ``alpha`` (a 0-d tensor, so a GPU never waits on it) and the losses of
    ``w`` and ``vbar`` on the batch.
    """
    grad_w, loss_w = gradient(loss_fn, w, batch)
    vbar = tuple(alpha * vi + (1 - alpha) * wi for vi, wi in zip(v, w, strict=True))
    grad_bar, loss_bar = gradient(loss_fn, vbar, batch)
    if alpha_lr > 0:
        slope = sum(((vi - wi) * g).sum() for vi, wi, g in zip(v, w, grad_bar, strict=True))
        new_alpha = (alpha - alpha_lr * slope).clamp(0.0, 1.0)
    else:
        new_alpha = alpha
    return axpy(w, grad_w, -lr), axpy(v, grad_bar, -lr * alpha), new_alpha, loss_w, loss_bar


class ApflClient(TorchClient):
    """APFL's client work: ``local-steps`` (or ``local-epochs``) steps of :func:`apfl_step`, batches of ``batch-size``.

    ``v_k`` (the first model received, the first time) and ``alpha_k`` (``apfl-alpha`` at
    first) live in ``Context.state``; the reply carries ``w_k``. Evaluation tests
    ``alpha_k v_k + (1 - alpha_k) w`` for the model ``w`` received; a client never sampled
    tests ``w``. Each step costs two gradient evaluations.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: ApflSettings, rng: np.random.Generator) -> TrainReport:
        num = len(self.train_y)
        steps, batches = round_batches(self.train_x, self.train_y, training, rng)
        w = tuple(p.detach() for p in self.model.parameters())
        kept = self.state.arrays(LOCAL_MODEL)
        v = w if kept is None else self.parameters_of(kept)
        first = float(self.state.value(MIXING, method.alpha))
        alpha = torch.tensor(first, dtype=w[0].dtype, device=self.device)
        losses, personal_losses = [], []
        self.model.train()
        for batch in batches:
            w, v, alpha, loss, personal_loss = apfl_step(model_loss(self.model), w, v, alpha, batch, lr=training.lr,
                                                         alpha_lr=method.alpha_lr)  # fmt: skip
            losses.append(loss)
            personal_losses.append(personal_loss)
        write_parameters(self.model.parameters(), v)
        self.state.set_arrays(LOCAL_MODEL, self.get_parameters({}))
        self.state.set_value(MIXING, float(alpha))
        write_parameters(self.model.parameters(), w)
        mean, personal = (float(torch.stack(x).double().mean()) for x in (losses, personal_losses))
        size = min(training.batch_size, num)
        return TrainReport(mean, steps, 2 * steps, 2 * steps * size,
                           extra={MIXING: float(alpha), PERSONAL_LOSS: personal})  # fmt: skip

    def parameters_of(self, arrays: list[np.ndarray]) -> Params:
        """The model's parameters (``parameters()`` order) within a full list of its arrays (``state_dict`` order)."""
        by_name = dict(zip(self.model.state_dict(), arrays, strict=True))
        return tuple(torch.as_tensor(by_name[name], device=self.device) for name, _ in self.model.named_parameters())

    def personal_model(self, training: TrainingSettings, method: ApflSettings) -> list[np.ndarray] | None:
        """``alpha_k v_k + (1 - alpha_k) w`` for the model ``w`` received; none before the client's first round."""
        kept = self.state.arrays(LOCAL_MODEL)
        if kept is None:
            return None
        alpha = float(self.state.value(MIXING, method.alpha))
        return [alpha * v + (1 - alpha) * w for v, w in zip(kept, self.get_parameters({}), strict=True)]
