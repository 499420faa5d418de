"""The Per-FedAvg client: ``local-steps`` meta-updates with step ``perfedavg-beta`` per round."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from clients.base import TorchClient
from clients.batches import Batch, batches_of, steps_for
from clients.meta import meta_direction
from clients.training import TrainReport, train_steps
from strategies.contracts.common import TrainingSettings
from strategies.contracts.perfedavg import CONTRACT, PerFedAvgSettings


class PerFedAvgClient(TorchClient):
    """Runs Per-FedAvg's local updates (ALGORITHMS.md section 1, seed eq. 7-8).

    Each of the ``local-steps`` (tau) updates (or ``local-epochs`` passes of them) draws
    three independent batches D, D', D'' of sizes ``batch-size``, ``perfedavg-outer-batch-size`` and
    ``perfedavg-hessian-batch-size`` from the client's training data (each without
    replacement, at most all n examples; they may overlap one another), estimates the meta-gradient with
    ``perfedavg-variant`` and steps ``w <- w - beta * direction``. Evaluation is the
    shared personalised protocol (the server sends alpha as the adaptation step).
    """

    contract = CONTRACT

    def batch_sizes(self, training: TrainingSettings, method: PerFedAvgSettings) -> dict[str, int]:
        return method.batch_sizes(training.batch_size)

    def local_train(
        self, training: TrainingSettings, method: PerFedAvgSettings, rng: np.random.Generator
    ) -> TrainReport:
        sizes = tuple(method.batch_sizes(training.batch_size).values())
        direction = meta_direction(alpha=method.alpha, variant=method.variant, delta=method.delta,
                                   relative_delta=method.delta_scale == "relative",
                                   curvature_bound=method.curvature_bound_on(self.model_card.smooth))  # fmt: skip
        num = len(self.train_y)
        steps = steps_for(num, method.examples_per_step(training.batch_size, num), training.local_steps,
                          training.local_epochs)  # fmt: skip
        # in a tuned run, phi is the alignment of successive meta-gradients (the steps actually taken)
        return train_steps(self.model, self.meta_batches(sizes, steps, rng), method.beta,
                           direction=direction, on_step=self.watched())  # fmt: skip

    def meta_batches(self, sizes: tuple[int, ...], steps: int, rng: np.random.Generator) -> Iterator[tuple[Batch, ...]]:
        """``steps`` triples (D, D', D''), each batch drawn without replacement, independently of the others.

        A batch larger than the training set takes all of it (min(b, n); ``strict-batches`` refuses instead).
        """
        num = len(self.train_y)
        # every step's draws first, in the order they were always drawn, so they reach the device in one copy
        drawn = [rng.choice(num, min(size, num), replace=False) for _ in range(steps) for size in sizes]
        batches = batches_of(self.train_x, self.train_y, drawn)
        for _ in range(steps):
            yield tuple(next(batches) for _ in sizes)
