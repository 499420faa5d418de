"""Per-FedAvg's meta-gradients as pure torch functions (no Flower, no module state).

A *loss function* here maps a tuple of parameter tensors and a batch to a scalar
loss, so the same code serves the MLP (through ``torch.func.functional_call``)
and the closed-form checks on a quadratic. Parameters are never modified in
place: every function returns new tensors, and nothing writes ``.data``.

For client loss ``f`` and parameters ``w`` (ALGORITHMS.md, section 1):

    w_tilde = w - alpha * grad(w, D)           # inner (adaptation) step
    g       = grad(w_tilde, D')                # outer gradient
    fo:  g
    hf:  g - alpha * (grad(w + delta g, D'') - grad(w - delta g, D'')) / (2 delta)
    so:  g - alpha * hvp(w, g, D'')            # exact, by double backward

With a curvature bound ``rho > 0`` (hf and so) the correction ``c = alpha * hvp`` is
scaled down to at most ``rho * ||g||`` (whole-model norms): ``c * min(1, rho ||g|| / ||c||)``.
Off smooth models a batch-sized Hessian-vector product can dwarf the gradient it
corrects (docs/methods/perfedavg.md, "SO off the MLP"); the bound keeps its direction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from clients.batches import Batch
from clients.losses import ExtraLoss, LossFn, Params, axpy, gradient
from clients.training import Step
from strategies.contracts.perfedavg import VARIANTS


def hessian_vector_product(loss_fn: LossFn, params: Params, vector: Params, batch: Batch) -> Params:
    """Exact ``Hessian(params, batch) @ vector`` by double backward; no Hessian is formed."""
    leaves = tuple(p.detach().requires_grad_(True) for p in params)
    grads = torch.autograd.grad(loss_fn(leaves, batch), leaves, create_graph=True)
    return torch.autograd.grad(grads, leaves, grad_outputs=tuple(v.detach() for v in vector))


def finite_difference_hvp(
    loss_fn: LossFn, params: Params, vector: Params, batch: Batch, delta: float, *, relative: bool = False
) -> Params:
    """Central-difference estimate ``(grad(w + delta v) - grad(w - delta v)) / (2 delta)``.

    ``relative``: the perturbation has length ``delta`` whatever ``||v||`` is (the
    difference step is ``delta / ||v||``). With the paper's fixed step, a large ``v``
    moves ``w`` by ``delta ||v||``, across the kinks of a ReLU network's loss, where a
    central difference is no estimate of the Hessian's action.
    """
    if relative:
        norm = float(torch.sqrt(sum((v.detach() ** 2).sum() for v in vector)))
        delta = delta / norm if norm > 0 else delta
    plus, _ = gradient(loss_fn, axpy(params, vector, delta), batch)
    minus, _ = gradient(loss_fn, axpy(params, vector, -delta), batch)
    return tuple((a - b) / (2.0 * delta) for a, b in zip(plus, minus, strict=True))


@dataclass(frozen=True)
class MetaGradient:
    """An estimate of ``(I - alpha * Hessian) grad f(w - alpha grad f(w))`` and its cost."""

    direction: Params
    outer_loss: torch.Tensor  # 0-d, on the model's device (see clients.training.Step)
    grad_evals: int
    hvp_evals: int


def norm(tensors: Params) -> float:
    """Euclidean norm of a tuple of tensors taken as one vector."""
    return float(torch.sqrt(sum((t.detach().double() ** 2).sum() for t in tensors)))


def bounded_correction(correction: Params, gradient: Params, bound: float) -> Params:
    """``correction`` scaled down so that ``||correction|| <= bound * ||gradient||``; ``bound = 0`` leaves it."""
    if bound <= 0:
        return correction
    size, limit = norm(correction), bound * norm(gradient)
    if size <= limit:
        return correction
    return tuple(c * (limit / size) for c in correction)


def meta_gradient(
    loss_fn: LossFn,
    params: Params,
    batches: tuple[Batch, Batch, Batch],
    *,
    alpha: float,
    variant: str,
    delta: float = 1e-3,
    relative_delta: bool = False,
    curvature_bound: float = 0.0,
) -> MetaGradient:
    """Per-FedAvg's meta-gradient with the estimator ``variant`` on batches ``(D, D', D'')``.

    Parameters
    ----------
    loss_fn
        Loss at given parameters on a batch.
    params
        The current local model ``w``.
    batches
        ``D`` for the inner step, ``D'`` for the outer gradient, ``D''`` for the
        Hessian term (unused by ``fo``).
    alpha
        The inner (adaptation) step size.
    variant
        ``fo`` (first order), ``hf`` (Hessian-free central difference) or ``so``
        (exact Hessian-vector product).
    delta
        The central difference's step (``hf`` only).
    relative_delta
        ``hf``: perturb by ``delta`` in length rather than ``delta`` times the outer gradient.
    curvature_bound
        ``hf`` and ``so``: the correction ``alpha * hvp`` is at most this times the outer
        gradient's norm (0: unbounded, the paper's estimator).

    Returns
    -------
    MetaGradient
        The direction, the outer loss ``f(w_tilde, D')``, and the gradient and
        Hessian-vector-product evaluations spent (fo 2 + 0, hf 4 + 0, so 2 + 1).

    """
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    inner_batch, outer_batch, hessian_batch = batches
    inner, _ = gradient(loss_fn, params, inner_batch)
    outer, outer_loss = gradient(loss_fn, axpy(params, inner, -alpha), outer_batch)
    if variant == "fo":
        return MetaGradient(outer, outer_loss, 2, 0)
    if variant == "hf":
        curvature = finite_difference_hvp(loss_fn, params, outer, hessian_batch, delta, relative=relative_delta)
        grad_evals, hvp_evals = 4, 0
    else:
        curvature = hessian_vector_product(loss_fn, params, outer, hessian_batch)
        grad_evals, hvp_evals = 2, 1
    if curvature_bound > 0:  # alpha * hvp, at most curvature_bound * ||g||
        curvature = bounded_correction(tuple(alpha * c for c in curvature), outer, curvature_bound)
        return MetaGradient(axpy(outer, curvature, -1.0), outer_loss, grad_evals, hvp_evals)
    return MetaGradient(axpy(outer, curvature, -alpha), outer_loss, grad_evals, hvp_evals)


def meta_direction(
    *, alpha: float, variant: str, delta: float, relative_delta: bool = False, curvature_bound: float = 0.0
) -> Callable[[LossFn, Params, object, ExtraLoss | None], Step]:
    """Per-FedAvg's step for :func:`clients.training.train_steps`: its batch is ``(D, D', D'')``."""

    def direction(loss_fn: LossFn, params: Params, batches: object, extra_loss: ExtraLoss | None = None) -> Step:
        if extra_loss is not None:
            raise ValueError("Per-FedAvg's meta-gradient takes no extra loss term")
        inner, outer, hessian = batches
        step = meta_gradient(loss_fn, params, (inner, outer, hessian), alpha=alpha, variant=variant, delta=delta,
                             relative_delta=relative_delta, curvature_bound=curvature_bound)  # fmt: skip
        # per-example gradients: D and D' once each; D'' twice for hf, once (as an HVP) for so
        sample_grads = len(inner[1]) + len(outer[1]) + {"fo": 0, "hf": 2, "so": 1}[variant] * len(hessian[1])
        return Step(step.direction, step.outer_loss, step.grad_evals, sample_grads, step.hvp_evals)

    return direction
