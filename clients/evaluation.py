"""Personalised evaluation: a copy of the model adapted on the client's own training data, then tested (no Flower)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from clients.batches import Batch, batch_indices, batches_of
from clients.losses import task_loss
from clients.training import train_steps


@torch.no_grad()
def accuracy_and_loss(model: nn.Module, x: Tensor, y: Tensor, chunk: int = 2048) -> tuple[float, float]:
    """Accuracy and mean loss of ``model`` on ``(x, y)``, in chunks (accuracy NaN for regression)."""
    model.eval()
    correct, total_loss = 0, 0.0
    for start in range(0, len(y), chunk):
        output = model(x[start : start + chunk])
        target = y[start : start + chunk]
        total_loss += task_loss(output, target, reduction="sum").item()
        if not target.is_floating_point():
            correct += (output.argmax(dim=1) == target).sum().item()
    accuracy = float("nan") if y.is_floating_point() else correct / len(y)
    return accuracy, total_loss / len(y)


@dataclass(frozen=True)
class PersonalisedResult:
    """Personalised (adapted) and global (un-adapted) test metrics of one client."""

    accuracy: float
    loss: float
    global_accuracy: float
    global_loss: float
    grad_evals: int


def personalised_evaluation(
    model: nn.Module,
    train: Batch,
    test: Batch,
    *,
    adapt_steps: int,
    adapt_lr: float,
    adapt_batch_size: int,
    rng: np.random.Generator,
) -> PersonalisedResult:
    """Adapt a copy of ``model`` on the client's training data, then test both.

    ``adapt_batch_size = 0`` adapts on the full training set. ``model`` itself is
    never changed.
    """
    global_accuracy, global_loss = accuracy_and_loss(model, *test)
    adapted = copy.deepcopy(model)
    num_train = len(train[1])
    batch = num_train if adapt_batch_size == 0 else adapt_batch_size
    report = train_steps(adapted, batches_of(*train, batch_indices(num_train, batch, adapt_steps, rng)), adapt_lr)
    accuracy, loss = accuracy_and_loss(adapted, *test)
    return PersonalisedResult(accuracy, loss, global_accuracy, global_loss, report.grad_evals)
