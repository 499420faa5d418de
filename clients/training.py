"""Local training and personalised evaluation as plain torch functions (no Flower)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def task_loss(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy for class labels; half the squared error for real targets (least squares).

    The task follows the labels' dtype, so one training loop serves classifiers and
    the convex regression problems of the diffusion theory checks.
    """
    if target.is_floating_point():
        squared = 0.5 * (output.reshape(target.shape) - target) ** 2
        return squared.mean() if reduction == "mean" else squared.sum()
    return F.cross_entropy(output, target, reduction=reduction)


def to_tensor(x: np.ndarray, device: torch.device) -> torch.Tensor:
    """Inputs as float32 on ``device``; uint8 images are scaled to [0, 1]."""
    tensor = torch.from_numpy(np.ascontiguousarray(x))
    tensor = tensor.float().div_(255.0) if tensor.dtype == torch.uint8 else tensor.float()
    return tensor.to(device)


def batch_indices(num_examples: int, batch_size: int, steps: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Yield ``steps`` batches of ``min(batch_size, num_examples)`` distinct indices.

    Batches walk through a fresh permutation of the data and start a new one when
    too few indices are left, so every example is seen once per pass.
    """
    size = min(batch_size, num_examples)
    order, cursor = rng.permutation(num_examples), 0
    for _ in range(steps):
        if cursor + size > num_examples:
            order, cursor = rng.permutation(num_examples), 0
        yield order[cursor : cursor + size]
        cursor += size


def steps_for(num_examples: int, batch_size: int, local_steps: int, local_epochs: float) -> int:
    """Local SGD steps: ``local_epochs`` passes when positive, else ``local_steps``."""
    if local_epochs > 0:
        per_epoch = -(-num_examples // min(batch_size, num_examples))
        return max(1, int(np.ceil(local_epochs * per_epoch)))
    return local_steps


@dataclass(frozen=True)
class TrainReport:
    """What a round of local training cost and achieved."""

    mean_loss: float
    steps: int
    grad_evals: int
    sample_grads: int
    hvp_evals: int = 0
    extra: dict = field(default_factory=dict)  # method-specific scalar metrics for the reply


def sgd_steps(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches: Iterator[np.ndarray], lr: float
) -> TrainReport:
    """Plain SGD on the given batches; returns the mean training loss and the work done."""
    model.train()
    losses, sample_grads = [], 0
    for idx in batches:
        index = torch.as_tensor(idx, device=x.device)
        loss = task_loss(model(x[index]), y[index])
        grads = torch.autograd.grad(loss, tuple(model.parameters()))
        with torch.no_grad():
            for param, grad in zip(model.parameters(), grads, strict=True):
                param.sub_(lr * grad)
        losses.append(loss.item())
        sample_grads += len(idx)
    return TrainReport(float(np.mean(losses)) if losses else float("nan"), len(losses), len(losses), sample_grads)


@torch.no_grad()
def accuracy_and_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 2048) -> tuple[float, float]:
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
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
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
    report = sgd_steps(adapted, *train, batch_indices(num_train, batch, adapt_steps, rng), adapt_lr)
    accuracy, loss = accuracy_and_loss(adapted, *test)
    return PersonalisedResult(accuracy, loss, global_accuracy, global_loss, report.grad_evals)
