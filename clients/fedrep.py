"""The FedRep client: steps on its own head with the body frozen, then on the body with the head frozen."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.batches import steps_for
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedrep import CONTRACT, HEAD_LOSS, FedRepSettings


class FedRepClient(TorchClient):
    """FedRep's client work (Algorithm 1) from the body it received and the head it kept.

    1. ``fedrep-head-steps`` (tau_h) steps (or ``fedrep-head-epochs`` passes)
       ``h <- h - lr grad_h F_k(phi, h)``, body ``phi`` frozen;
    2. the shared ``local-steps`` or ``local-epochs`` (tau_phi) steps
       ``phi <- phi - lr grad_phi F_k(phi, h)``, head frozen;

    both on batches of ``batch-size``. The base client merged the kept head (the initial
    one, the first time) into the model before, and keeps the new one afterwards; the
    reply carries the body alone. ``train-loss`` is the body steps' mean loss,
    ``fedrep-head-loss`` the head steps'.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: FedRepSettings, rng: np.random.Generator) -> TrainReport:
        head = [name for name, _ in self.model.named_parameters() if name in self.personal_names]
        body = [name for name, _ in self.model.named_parameters() if name not in self.personal_names]
        head_steps = steps_for(len(self.train_y), training.batch_size, method.head_steps, method.head_epochs)
        fitted = self.local_sgd(training, rng, steps=head_steps, trainable=head)
        learnt = self.local_sgd(training, rng, trainable=body)
        return TrainReport(learnt.mean_loss, fitted.steps + learnt.steps, fitted.grad_evals + learnt.grad_evals,
                           fitted.sample_grads + learnt.sample_grads, extra={HEAD_LOSS: fitted.mean_loss})  # fmt: skip
