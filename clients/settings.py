"""The client-side hyperparameters, and how a server's config dict overrides them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# Run-config / fit-config key -> ClientSettings field. The server may send any of
# these in a round's config dict; the value sent wins over the run's default.
CONFIG_FIELDS = {
    "lr": "lr",
    "local-steps": "local_steps",
    "local-epochs": "local_epochs",
    "batch-size": "batch_size",
    "adapt-steps": "adapt_steps",
    "adapt-lr": "adapt_lr",
    "adapt-batch-size": "adapt_batch_size",
    "alpha": "alpha",
    "beta": "beta",
    "delta": "delta",
    "variant": "variant",
    "outer-batch-size": "outer_batch_size",
    "hessian-batch-size": "hessian_batch_size",
    "mu": "mu",
}


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """Hyperparameters of local training and personalised evaluation.

    Attributes
    ----------
    lr
        Local SGD step size (Per-FedAvg's ``beta`` for the FedAvg baseline).
    local_steps
        SGD steps per round; ignored when ``local_epochs`` > 0.
    local_epochs
        Passes over the local data per round (0: use ``local_steps``).
    batch_size
        Mini-batch size (capped at the client's example count).
    adapt_steps, adapt_lr, adapt_batch_size
        Personalised evaluation: SGD steps of size ``adapt_lr`` (0: ``alpha``) on
        batches of the client's own training data (``adapt_batch_size`` 0 = the
        whole set).
    alpha, beta, delta, variant
        Per-FedAvg: inner step, outer step, central-difference step (``hf``) and
        meta-gradient estimator (``fo``, ``hf``, ``so``).
    outer_batch_size, hessian_batch_size
        Per-FedAvg: sizes of ``D'`` and ``D''`` (``batch_size`` is ``D``).
    mu
        Diffusion: the local SGD step size of a participating agent.
    seed
        Base of every per-client, per-round generator.
    device
        ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
    num_threads
        ``torch.set_num_threads`` for this client process (0 leaves torch's default).

    """

    lr: float = 0.05
    local_steps: int = 10
    local_epochs: float = 0.0
    batch_size: int = 10
    adapt_steps: int = 1
    adapt_lr: float = 0.0
    adapt_batch_size: int = 10
    alpha: float = 0.05
    beta: float = 0.05
    delta: float = 1e-3
    variant: str = "hf"
    outer_batch_size: int = 10
    hessian_batch_size: int = 10
    mu: float = 0.05
    seed: int = 0
    device: str = "auto"
    num_threads: int = 1

    def updated(self, config: dict) -> ClientSettings:
        """A copy with the values the server sent in ``config`` (known keys only).

        Integer fields take the nearest integer of a real value (FATHOM broadcasts a
        real batch size; ``round`` here is Python's, halves to even).
        """
        changes = {}
        for key, field in CONFIG_FIELDS.items():
            if key in config:
                kind = type(getattr(self, field))
                value = config[key]
                changes[field] = int(round(value)) if kind is int and isinstance(value, float) else kind(value)
        return dataclasses.replace(self, **changes)

    def adaptation_lr(self) -> float:
        """The personalisation step: ``adapt_lr``, or ``alpha`` when ``adapt_lr`` is 0."""
        return self.adapt_lr if self.adapt_lr > 0 else self.alpha

    def torch_device(self) -> torch.device:
        """The device to train on: CUDA when asked for or (``auto``) when present."""
        if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()):
            return torch.device("cuda")
        return torch.device("cpu")
