"""The one local training loop, as plain torch functions (no Flower).

Every client trains through :func:`train_steps`: from a model's parameters it takes
one step per batch, ``w <- w - lr * direction``, and returns the model's new
parameters with what the steps cost. What a step is can change in five places:

- ``direction``: the default is the gradient of the task loss (SGD); Per-FedAvg
  passes its meta-gradient, whose batch is the triple (D, D', D'').
- ``extra_loss``: a term added to the loss before differentiating, as a function
  of the parameters (:func:`proximal_term` is FedProx's proximal term and Ditto's
  regulariser); the training loss reported stays the task's.
- ``batch_term``: a term added to the loss as a function of the parameters, the batch
  and the model's pass over it (:class:`Forward`: its output and its representation,
  ``features(x)``), from the same forward pass: MOON's contrastive term on the
  representation, FedProto's distance of the representations to the class prototypes.
- ``on_step``: called after every step with that step (FATHOM's ``phi`` watches
  the gradients go by).
- ``trainable``: the parameters the steps move, by name, the rest held fixed (FedRep
  trains its head with the body frozen, then its body with the head frozen).

Parameters are never modified in place while training: every step makes new
tensors (``torch.func.functional_call`` evaluates the model at them), and the
model is updated once, at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from clients.batches import Batch, round_batches
from clients.losses import (
    ExtraLoss,
    Forward,
    LastForward,
    LossFn,
    Params,
    axpy,
    gradient,
    model_loss,
    model_loss_with_forward,
)
from strategies.contracts.common import TrainingSettings

BatchTerm = Callable[[Params, Batch, Forward], Tensor]


@dataclass(frozen=True)
class Step:
    """One local step: the direction taken (before the step size), the task loss, and what it cost.

    ``loss`` stays a 0-d tensor on the model's device: reading it as a number every step
    would make a GPU wait for each step before the next is queued.
    """

    direction: Params
    loss: Tensor
    grad_evals: int
    sample_grads: int
    hvp_evals: int = 0


Direction = Callable[[LossFn, Params, object, ExtraLoss | None], Step]


def gradient_direction(loss_fn: LossFn, params: Params, batch: Batch, extra_loss: ExtraLoss | None = None) -> Step:
    """SGD's direction: the mini-batch gradient (one gradient evaluation, one per example)."""
    grads, loss = gradient(loss_fn, params, batch, extra_loss)
    return Step(grads, loss, 1, len(batch[1]))


@dataclass(frozen=True)
class TrainReport:
    """What a round of local training cost and achieved."""

    mean_loss: float
    steps: int
    grad_evals: int
    sample_grads: int
    hvp_evals: int = 0
    extra: dict = field(default_factory=dict)  # method-specific scalar metrics for the reply
    arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)  # the array sets the contract returns, by name
    first_loss: float = math.nan  # the first step's loss: the model as received, on the first batch


class Alignment:
    """FATHOM's local signal ``phi = min_k cos(g_k, g_0 + ... + g_k)`` over the steps it is shown; one running sum.

    The displacement after step k is ``lr`` times that sum, and a cosine does not see
    the positive factor. A cosine is 0 where either norm is 0, and clamped to [-1, 1]
    against rounding.
    """

    def __init__(self) -> None:
        self.running: torch.Tensor | None = None
        self.smallest: torch.Tensor | None = None  # on the device, float64: read once, by ``phi``

    def __call__(self, step: Step) -> None:
        flat = torch.cat([g.reshape(-1) for g in step.direction])
        self.running = flat.clone() if self.running is None else self.running + flat
        # float64 from the float32 norms and dot product, as Python floats would give, without a host round trip
        norm = flat.norm().double() * self.running.norm().double()
        dot = torch.dot(flat, self.running).double()
        cosine = torch.where(norm > 0, (dot / norm).clamp(-1.0, 1.0), torch.zeros_like(norm))
        self.smallest = cosine if self.smallest is None else torch.minimum(self.smallest, cosine)

    @property
    def phi(self) -> float:
        """The smallest cosine so far (``inf`` before any step)."""
        return math.inf if self.smallest is None else float(self.smallest)


def train_steps(
    model: nn.Module,
    batches: Iterable[object],
    lr: float,
    *,
    direction: Direction = gradient_direction,
    extra_loss: ExtraLoss | None = None,
    batch_term: BatchTerm | None = None,
    on_step: Callable[[Step], None] | None = None,
    trainable: Collection[str] | None = None,
) -> TrainReport:
    """``w <- w - lr * direction(w, batch)`` for every batch, then the model holds the final ``w``.

    Parameters
    ----------
    model
        The network; its parameters are the starting point and receive the result.
    batches
        What each step consumes: ``(x, y)`` for SGD, ``(D, D', D'')`` for Per-FedAvg.
    lr
        The step size.
    direction
        Maps ``(loss_fn, params, batch, extra_loss)`` to a :class:`Step`.
    extra_loss
        Added to the task loss before differentiating (a function of the parameters).
    batch_term
        Added too: a function of the parameters, the batch and the model's pass over it
        (:class:`Forward`), from the pass that computed the task loss. SGD steps only (the
        default ``direction``); the model must offer ``forward(x, with_features=True)``.
    on_step
        Called with every step, after it is taken.
    trainable
        The names of the parameters to train (``named_parameters``'); the others stay
        as they are. ``direction``, ``extra_loss`` and ``on_step`` then see the trained
        parameters alone, in model order. ``None`` trains every parameter.

    Raises
    ------
    ValueError
        If ``trainable`` names a parameter the model lacks, or none at all; or a
        ``batch_term`` comes with another direction than SGD's.

    """
    names = [name for name, _ in model.named_parameters()]
    if trainable is not None:
        unknown = sorted(set(trainable) - set(names))
        if unknown or not trainable:
            raise ValueError(f"trainable names {unknown or '(none)'}; the model's parameters are {names}")
        trainable = [name for name in names if name in trainable]
    if batch_term is None:
        loss_fn = model_loss(model, trainable)
    else:
        if direction is not gradient_direction:
            raise ValueError("a batch_term is added to SGD's loss; this step's direction is another")
        loss_fn, last = model_loss_with_forward(model, trainable)
        extra_loss = with_batch_term(extra_loss, batch_term, last)
    targets = [p for name, p in model.named_parameters() if trainable is None or name in trainable]
    params = tuple(p.detach() for p in targets)
    model.train()
    losses, grad_evals, hvp_evals, sample_grads = [], 0, 0, 0
    for batch in batches:
        step = direction(loss_fn, params, batch, extra_loss)
        params = axpy(params, step.direction, -lr)
        if on_step is not None:
            on_step(step)
        losses.append(step.loss)
        grad_evals += step.grad_evals
        hvp_evals += step.hvp_evals
        sample_grads += step.sample_grads
    write_parameters(targets, params)
    mean, first = math.nan, math.nan
    if losses:
        stacked = torch.stack(losses).double()
        mean, first = torch.stack([stacked.mean(), stacked[0]]).tolist()  # the round's one read
    return TrainReport(mean, len(losses), grad_evals, sample_grads, hvp_evals, first_loss=first)


def with_batch_term(extra_loss: ExtraLoss | None, batch_term: BatchTerm, last: LastForward) -> ExtraLoss:
    """``extra_loss`` plus ``batch_term`` on the batch and pass the loss just computed (``gradient`` calls them so)."""

    def extra(params: Params) -> Tensor:
        term = batch_term(params, last.batch, last.forward)
        return term if extra_loss is None else term + extra_loss(params)

    return extra


def write_parameters(targets: Iterable[nn.Parameter], values: Params) -> None:
    """Copy ``values`` into the parameters ``targets`` (``model.parameters()``, or some of them), in order."""
    with torch.no_grad():
        for target, value in zip(targets, values, strict=True):
            target.copy_(value)


# ------------------------------------------------------------------ batches


# --------------------------------------------------------------- evaluation




def watching(alignment: Alignment | None, on_step: Callable[[Step], None] | None) -> Callable[[Step], None] | None:
    """``on_step``, and in a tuned run (an ``alignment``) also the round's alignment of the steps."""
    if alignment is None:
        return on_step
    if on_step is None:
        return alignment

    def both(step: Step) -> None:
        on_step(step)
        alignment(step)

    return both


def local_sgd(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    training: TrainingSettings,
    rng: np.random.Generator,
    *,
    lr: float | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    extra_loss: ExtraLoss | None = None,
    batch_term: BatchTerm | None = None,
    on_step: Callable[[Step], None] | None = None,
    trainable: Collection[str] | None = None,
) -> TrainReport:
    """SGD on ``(x, y)``: ``lr``, ``batch-size`` and ``local-steps`` or ``local-epochs`` of ``training``.

    A method may change the step size, the number of steps, the batch size, add a loss
    term of the parameters (``extra_loss``) or of the batch and the model's pass over it
    (``batch_term``: output and representation), watch every step, or train only some
    parameters (``trainable``, by name; the rest frozen) (see :func:`train_steps`).
    """
    _, batches = round_batches(x, y, training, rng, batch_size=batch_size, steps=steps)
    return train_steps(model, batches, training.lr if lr is None else lr, extra_loss=extra_loss,
                       batch_term=batch_term, on_step=on_step, trainable=trainable)  # fmt: skip
