"""The MOON client: local SGD plus a model-contrastive term on the representation, through the loss hook."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from clients.base import TorchClient
from clients.batches import Batch
from clients.losses import Forward, Params, features_at
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.moon import CONTRACT, MoonSettings

PREVIOUS = "previous-model"  # the parameters after this client's last round, in Context.state


def model_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor, temperature: float) -> Tensor:
    """MOON's ``l_con``, the batch mean: a two-way softmax over cosines that prefers ``z_glob`` to ``z_prev``."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1)
    return F.cross_entropy(logits / temperature, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MoonClient(TorchClient):
    """Local SGD on ``CE(w) + mu * l_con(features_w(x), features_glob(x), features_prev(x))``.

    ``w_glob`` is the model received; ``w_prev`` this client's model after its previous
    round (the received one, the first time, when the term is the constant log 2). Both
    representations are computed on each step's batch with no gradient, on copies of the
    BatchNorm buffers. The reported ``train-loss`` is the cross-entropy alone.
    """

    contract = CONTRACT

    def local_train(self, training: TrainingSettings, method: MoonSettings, rng: np.random.Generator) -> TrainReport:
        received = [p.detach().clone() for p in self.model.parameters()]
        kept = self.state.arrays(PREVIOUS)
        previous = received if kept is None else [torch.as_tensor(a, device=self.device) for a in kept]

        def contrastive(params: Params, batch: Batch, forward: Forward) -> Tensor:
            x = batch[0]
            z_glob, z_prev = features_at(self.model, received, x), features_at(self.model, previous, x)
            return method.mu * model_contrastive_loss(forward.features, z_glob, z_prev, method.temperature)

        report = self.local_sgd(training, rng, batch_term=contrastive)
        self.state.set_arrays(PREVIOUS, [p.detach().cpu().numpy().copy() for p in self.model.parameters()])
        return report
