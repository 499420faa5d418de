"""The losses a local step differentiates: the task's, a model's at given parameters, and the terms methods add.

Parameters are never modified in place: :func:`parameterised` evaluates the model at new
tensors through ``torch.func.functional_call`` (no Flower).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

from clients.batches import Batch

Params = tuple[Tensor, ...]
LossFn = Callable[[Params, Batch], Tensor]
ExtraLoss = Callable[[Params], Tensor]


Params = tuple[Tensor, ...]


LossFn = Callable[[Params, Batch], Tensor]


ExtraLoss = Callable[[Params], Tensor]


@dataclass(frozen=True)
class Forward:
    """The model's pass over a step's batch at the step's parameters: its output and its representation."""

    output: Tensor
    features: Tensor


def task_loss(output: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy for class labels; half the squared error for real targets (least squares).

    The task follows the labels' dtype, so one training loop serves classifiers and
    the convex regression problems of the diffusion theory checks.
    """
    if target.is_floating_point():
        squared = 0.5 * (output.reshape(target.shape) - target) ** 2
        return squared.mean() if reduction == "mean" else squared.sum()
    return F.cross_entropy(output, target, reduction=reduction)


def parameterised(model: nn.Module, trainable: Sequence[str] | None = None) -> Callable[[Params], dict[str, Tensor]]:
    """Parameters (all, or the ``trainable`` ones, in ``named_parameters`` order) -> the dict ``functional_call`` takes.

    The parameters not in ``trainable`` are held at their values now.
    """
    names = [name for name, _ in model.named_parameters()]
    if trainable is None:
        return lambda params: dict(zip(names, params, strict=True))
    frozen = {name: p.detach() for name, p in model.named_parameters() if name not in trainable}
    moving = [name for name in names if name in trainable]
    return lambda params: {**frozen, **dict(zip(moving, params, strict=True))}


def model_loss(model: nn.Module, trainable: Sequence[str] | None = None) -> LossFn:
    """The task loss of ``model`` at the given parameters (in ``named_parameters`` order).

    With ``trainable`` (parameter names), the loss takes those parameters alone, in
    ``named_parameters`` order, and holds the others at their values now.
    """
    mapping = parameterised(model, trainable)

    def loss(params: Params, batch: Batch) -> Tensor:
        x, y = batch
        return task_loss(functional_call(model, mapping(params), (x,)), y)

    return loss


class LastForward:
    """The most recent batch and pass of a :func:`model_loss_with_forward` loss, for the step's batch term."""

    batch: Batch
    forward: Forward


def model_loss_with_forward(model: nn.Module, trainable: Sequence[str] | None = None) -> tuple[LossFn, LastForward]:
    """:func:`model_loss` whose pass also yields the representation, kept (with the batch) in the returned holder.

    The model must offer ``forward(x, with_features=True)`` (a ``SplitModel``). The loss is
    still the task's; the holder lets a batch term reuse the pass instead of a second one.
    """
    mapping, last = parameterised(model, trainable), LastForward()

    def loss(params: Params, batch: Batch) -> Tensor:
        x, y = batch
        output, features = functional_call(model, mapping(params), (x,), {"with_features": True})
        last.batch, last.forward = batch, Forward(output, features)
        return task_loss(output, y)

    return loss, last


@torch.no_grad()
def features_at(model: nn.Module, values: Iterable[Tensor], x: Tensor) -> Tensor:
    """The representation ``features(x)`` of ``model`` at other parameters ``values`` (``named_parameters`` order).

    Evaluated in the model's current mode on copies of its buffers, so a BatchNorm's
    running statistics are not moved by this extra pass; no gradient flows.
    """
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    return functional_call(model, {**parameterised(model)(tuple(values)), **buffers}, (x,), {"with_features": True})[1]


def gradient(
    loss_fn: LossFn, params: Params, batch: Batch, extra_loss: ExtraLoss | None = None
) -> tuple[Params, Tensor]:
    """The gradient of ``loss_fn (+ extra_loss)`` at ``params`` and the task loss there; the inputs are not changed."""
    leaves = tuple(p.detach().requires_grad_(True) for p in params)
    loss = loss_fn(leaves, batch)
    total = loss if extra_loss is None else loss + extra_loss(leaves)
    return torch.autograd.grad(total, leaves), loss.detach()


def proximal_term(anchor: Params, weight: float) -> ExtraLoss:
    """``weight / 2 * ||w - anchor||^2`` as a function of the parameters ``w``: an ``extra_loss``.

    Its gradient is ``weight * (w - anchor)``: FedProx's proximal term (anchor: the global
    model received, weight: mu) and Ditto's regulariser (anchor: the global model, weight:
    lambda). ``anchor`` is detached, so no gradient flows into it.
    """
    fixed = tuple(a.detach() for a in anchor)

    def term(params: Params) -> Tensor:
        return 0.5 * weight * sum(((p - a) ** 2).sum() for p, a in zip(params, fixed, strict=True))

    return term


def axpy(params: Params, direction: Iterable[Tensor], scale: float) -> Params:
    """``params + scale * direction``, as new tensors."""
    return tuple(p + scale * d for p, d in zip(params, direction, strict=True))
