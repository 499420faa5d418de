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
        Personalised evaluation: SGD steps of size ``adapt_lr`` on batches of the
        client's own training data (``adapt_batch_size`` 0 = the whole set).
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
    batch_size: int = 40
    adapt_steps: int = 1
    adapt_lr: float = 0.05
    adapt_batch_size: int = 40
    seed: int = 0
    device: str = "auto"
    num_threads: int = 1

    def updated(self, config: dict) -> ClientSettings:
        """A copy with the values the server sent in ``config`` (known keys only)."""
        changes = {}
        for key, field in CONFIG_FIELDS.items():
            if key in config:
                kind = type(getattr(self, field))
                changes[field] = kind(config[key])
        return dataclasses.replace(self, **changes)

    def torch_device(self) -> torch.device:
        """The device to train on: CUDA when asked for or (``auto``) when present."""
        if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()):
            return torch.device("cuda")
        return torch.device("cpu")
