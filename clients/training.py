"""The one local training loop, and personalised evaluation, as plain torch functions (no Flower).

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

import copy
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

Params = tuple[Tensor, ...]
Batch = tuple[Tensor, Tensor]
LossFn = Callable[[Params, Batch], Tensor]
ExtraLoss = Callable[[Params], Tensor]


@dataclass(frozen=True)
class Forward:
    """The model's pass over a step's batch at the step's parameters: its output and its representation."""

    output: Tensor
    features: Tensor


BatchTerm = Callable[[Params, Batch, Forward], Tensor]


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


def batches_of(x: Tensor, y: Tensor, indices: Iterable[np.ndarray]) -> Iterator[Batch]:
    """``(x[idx], y[idx])`` for every index array.

    The indices are drawn all at once, when the first batch is asked for, and sent to
    ``x``'s device in one copy: a copy per step would make a GPU finish each step before
    the next is queued. They are the same indices as drawn one by one, as long as
    nothing else draws from their generator in between (nothing does while training).
    """
    arrays = list(indices)
    if not arrays:
        return
    index = torch.as_tensor(np.concatenate(arrays), device=x.device)
    for part in torch.split(index, [len(a) for a in arrays]):
        yield x[part], y[part]


def steps_for(num_examples: int, batch_size: int, local_steps: int, local_epochs: float) -> int:
    """Local SGD steps: ``local_epochs`` passes when positive, else ``local_steps``."""
    if local_epochs > 0:
        per_epoch = -(-num_examples // min(batch_size, num_examples))
        return max(1, int(np.ceil(local_epochs * per_epoch)))
    return local_steps


def to_tensor(
    x: np.ndarray, device: torch.device, normalisation: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
) -> Tensor:
    """Inputs as float32 on ``device``; uint8 images are scaled to [0, 1], then normalised per channel.

    ``normalisation`` is ``(means, stds)``, one value per channel (dimension 1), from
    the run config's ``input-mean`` and ``input-std``; empty leaves the inputs as they are.

    Raises
    ------
    ValueError
        When the inputs have another number of channels than ``normalisation`` values.

    """
    tensor = torch.from_numpy(np.ascontiguousarray(x))
    tensor = tensor.float().div_(255.0) if tensor.dtype == torch.uint8 else tensor.float()
    means, stds = normalisation
    if means:
        if tensor.dim() < 2 or tensor.shape[1] != len(means):
            raise ValueError(f"run config keys 'input-mean'/'input-std' give {len(means)} channel values, but one "
                             f"input has shape {tuple(tensor.shape[1:])} (channels first)")  # fmt: skip
        shape = (1, len(means)) + (1,) * (tensor.dim() - 2)
        tensor = tensor.sub_(torch.tensor(means).view(shape)).div_(torch.tensor(stds).view(shape))
    return tensor.to(device)


# --------------------------------------------------------------- evaluation


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
