"""Strategy name -> (strategy class, client class, its settings): where methods are wired up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.config import Settings
from clients import TorchClient
from clients.diffusion import DiffusionClient
from clients.fathom import FathomClient
from clients.perfedavg import PerFedAvgClient
from strategies import PerFedAvg, PersonalisedFedAvg
from strategies.diffusion import Diffusion
from strategies.fathom import Fathom


def fedavg_arguments(settings: Settings) -> dict:
    """FedAvg broadcasts its local SGD settings in every fit config."""
    return {
        "fit_config": {
            "lr": settings.lr,
            "local-steps": settings.local_steps,
            "local-epochs": settings.local_epochs,
            "batch-size": settings.batch_size,
        }
    }


def perfedavg_arguments(settings: Settings) -> dict:
    """Per-FedAvg's meta-learning hyperparameters (the strategy validates them too)."""
    return {
        "alpha": settings.alpha,
        "beta": settings.beta,
        "delta": settings.delta,
        "variant": settings.variant,
        "local_steps": settings.local_steps,
        "batch_size": settings.batch_size,
        "outer_batch_size": settings.outer_batch_size,
        "hessian_batch_size": settings.hessian_batch_size,
    }


def fathom_arguments(settings: Settings) -> dict:
    """FATHOM starts from lr, local-epochs and batch-size, and tunes them online."""
    return {
        "lr": settings.lr,
        "epochs": settings.local_epochs,
        "batch_size": float(settings.batch_size),
        "settings": settings.fathom_settings(),
    }


def diffusion_arguments(settings: Settings) -> dict:
    """The network (built once the agents are known), the agents' local SGD and snapshots."""
    return {
        "network": settings.network_settings(),
        "mu": settings.mu,
        "local_steps": settings.local_steps,
        "batch_size": settings.batch_size,
        "snapshot_every": settings.snapshot_every,
    }


@dataclass(frozen=True)
class Method:
    """A federated method: its strategy class, its client class, and its own strategy arguments.

    ``strategy_arguments`` derives the method-specific keyword arguments from the
    settings; the server adds those every strategy takes.
    """

    strategy_class: type
    client_class: type
    strategy_arguments: Callable[[Settings], dict]


METHODS: dict[str, Method] = {
    "fedavg": Method(PersonalisedFedAvg, TorchClient, fedavg_arguments),
    "perfedavg": Method(PerFedAvg, PerFedAvgClient, perfedavg_arguments),
    "fathom": Method(Fathom, FathomClient, fathom_arguments),
    "diffusion": Method(Diffusion, DiffusionClient, diffusion_arguments),
}
STRATEGY_NAMES = tuple(METHODS)
