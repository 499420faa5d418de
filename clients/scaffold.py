"""The SCAFFOLD client: local SGD corrected by ``c - c_i``; its control variate ``c_i`` kept in ``Context.state``."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from clients.base import TorchClient
from clients.losses import ExtraLoss, Params
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.scaffold import CONTRACT, CONTROL, CORRECTION_NORM, DELTA_CONTROL, ScaffoldSettings

CLIENT_CONTROL = "client-control"  # c_i, in Context.state


def linear_term(direction: Params) -> ExtraLoss:
    """``<direction, w>`` as a function of the parameters ``w``: its gradient is ``direction``, exactly.

    Added to the loss, it turns every step ``w - lr g`` into ``w - lr (g + direction)``.
    """
    fixed = tuple(d.detach() for d in direction)

    def term(params: Params) -> torch.Tensor:
        return sum((p * d).sum() for p, d in zip(params, fixed, strict=True))

    return term


def control_update(
    client_control: list[np.ndarray], control: list[np.ndarray], x: list[np.ndarray], y: list[np.ndarray], *,
    steps: int, lr: float,
) -> list[np.ndarray]:  # fmt: skip
    """Option II: ``c_i+ = c_i - c + (x - y) / (K lr)``, array by array."""
    return [ci - c + (xx - yy) / (steps * lr) for ci, c, xx, yy in zip(client_control, control, x, y, strict=True)]


class ScaffoldClient(TorchClient):
    """SCAFFOLD's client work (Algorithm 1, option II) from the model ``x`` and control variate ``c`` it receives.

    ``K`` local SGD steps (the shared ``lr``, ``local-steps`` or ``local-epochs``, ``batch-size``)
    each take ``g(y) - c_i + c``, through the training loop's extra loss ``<c - c_i, y>``;
    then ``c_i+ = c_i - c + (x - y) / (K lr)`` replaces ``c_i`` in ``Context.state`` (zero the
    first time), and the reply carries ``y`` and ``delta-control = c_i+ - c_i``. With
    ``c = c_i = 0`` the steps are FedAvg's, bit for bit.
    """

    contract = CONTRACT

    def local_train(
        self, training: TrainingSettings, method: ScaffoldSettings, rng: np.random.Generator
    ) -> TrainReport:
        x = self.shared_arrays()
        control = self.received[CONTROL]
        client_control = self.state.arrays(CLIENT_CONTROL) or [np.zeros_like(c) for c in control]
        correction = [c - ci for c, ci in zip(control, client_control, strict=True)]
        by_name = dict(zip(self.shared_names, correction, strict=True))
        terms = tuple(torch.as_tensor(by_name[name], device=self.device) for name, _ in self.model.named_parameters())
        report = self.local_sgd(training, rng, extra_loss=linear_term(terms))
        updated = control_update(client_control, control, x, self.shared_arrays(), steps=report.steps, lr=training.lr)
        self.state.set_arrays(CLIENT_CONTROL, updated)
        # in the dtype of the control received: the server refuses a set whose dtypes differ from what it sent (a
        # BatchNorm counter's delta would be float64); counters are buffers, which the linear term never reads
        delta = [(new - old).astype(c.dtype, copy=False) for new, old, c in zip(updated, client_control, control,
                                                                               strict=True)]  # fmt: skip
        norm = float(np.sqrt(sum(float(np.vdot(d, d)) for d in correction)))
        return dataclasses.replace(report, arrays={DELTA_CONTROL: delta}, extra={CORRECTION_NORM: norm})
