"""The Ditto client: FedAvg's local update for the server, and a personal model kept in ``Context.state``."""

from __future__ import annotations

import numpy as np

from clients.base import TorchClient
from clients.batches import steps_for
from clients.losses import proximal_term
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.ditto import CONTRACT, PERSONAL_LOSS, PERSONAL_ROUNDS, DittoSettings

PERSONAL = "personal-model"


class DittoClient(TorchClient):
    """Ditto's client work (Algorithm 1): two updates from the global model ``w^t`` it receives.

    1. The global update: FedAvg's local SGD from ``w^t``; its result ``w_k`` is what the
       client returns for aggregation.
    2. The personal update: ``ditto-personal-steps`` steps (or ``ditto-personal-epochs``
       passes) of size ``ditto-personal-lr``,
       ``v <- v - eta (grad F_k(v; batch) + lambda (v - w^t))``, from the personal model
       ``v_k`` kept in ``Context.state`` (the first global model received, the first time).

    Evaluation tests ``v_k`` as it is (``accuracy``) and ``w^t`` (``global-accuracy``); a
    client never sampled has no ``v_k`` yet and tests ``w^t`` for both (the strategy sends
    ``adapt-steps`` 0).
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: DittoSettings, rng: np.random.Generator) -> TrainReport:
        received = self.get_parameters({})  # w^t
        anchor = tuple(p.detach().clone() for p in self.model.parameters())
        shared = self.local_sgd(training, rng)
        returned = self.get_parameters({})  # w_k, for the server
        self.set_parameters(self.state.arrays(PERSONAL) or received)
        personal_rng = rng.spawn(1)[0]  # the personal model's batches: a stream of their own
        steps = steps_for(len(self.train_y), training.batch_size, method.personal_steps, method.personal_epochs)
        personal = self.local_sgd(training, personal_rng, lr=method.personal_lr, steps=steps,
                                  extra_loss=proximal_term(anchor, method.lambda_))  # fmt: skip
        rounds = int(self.state.value(PERSONAL_ROUNDS, 0)) + 1
        self.state.set_arrays(PERSONAL, self.get_parameters({}))
        self.state.set_value(PERSONAL_ROUNDS, rounds)
        self.set_parameters(returned)
        return TrainReport(
            shared.mean_loss, shared.steps + personal.steps, shared.grad_evals + personal.grad_evals,
            shared.sample_grads + personal.sample_grads,
            extra={PERSONAL_LOSS: personal.mean_loss, PERSONAL_ROUNDS: rounds},
        )  # fmt: skip

    def personal_model(self, training: TrainingSettings, method: DittoSettings) -> list[np.ndarray] | None:
        """The personal model ``v_k``, tested beside the global ``w^t``; a client never sampled has none yet."""
        return self.state.arrays(PERSONAL)
