"""The FedProto client: local SGD with its representations pulled towards the global prototypes, via the loss hook."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from clients.base import TorchClient
from clients.batches import Batch
from clients.losses import Forward, Params
from clients.training import TrainReport
from strategies.contracts.common import TrainingSettings
from strategies.contracts.fedproto import CONTRACT, COUNTS, PROTOTYPES, FedProtoSettings


@torch.no_grad()
def class_prototypes(model: nn.Module, x: Tensor, y: Tensor, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Each class's mean representation ``features(x)`` over ``(x, y)`` (eval mode), and its example count."""
    model.eval()
    z = torch.cat([model.features(part) for part in torch.split(x, 2048)])
    sums = torch.zeros(classes, z.shape[1], dtype=z.dtype, device=z.device).index_add_(0, y, z)
    counts = torch.bincount(y, minlength=classes).to(z.dtype)
    means = sums / counts.clamp(min=1)[:, None]
    return means.cpu().numpy().astype(np.float32), counts.cpu().numpy().astype(np.float32)


class FedProtoClient(TorchClient):
    """Local SGD on ``CE + lambda * MSE(z, C^y)``; returns its class prototypes and counts, never its model.

    The MSE is the mean over the batch and the representation's entries, as FedProto's
    and PFLlib's code compute it; an example whose class has no global prototype yet adds
    zero (its row is compared with itself). The base keeps the whole model in
    ``Context.state`` (``WholeModel``).
    """

    contract = CONTRACT

    def local_train(
        self, training: TrainingSettings, method: FedProtoSettings, rng: np.random.Generator
    ) -> TrainReport:
        protos = torch.as_tensor(self.received[PROTOTYPES][0], device=self.device)
        held = torch.as_tensor(self.received[COUNTS][0] > 0, device=self.device)

        def towards_prototypes(params: Params, batch: Batch, forward: Forward) -> Tensor:
            y = batch[1]
            target = torch.where(held[y][:, None], protos[y], forward.features.detach())
            return method.lambda_ * F.mse_loss(forward.features, target)

        report = self.local_sgd(training, rng, batch_term=towards_prototypes if bool(held.any()) else None)
        own, counts = class_prototypes(self.model, self.train_x, self.train_y, len(protos))
        return dataclasses.replace(report, arrays={PROTOTYPES: [own], COUNTS: [counts]})
