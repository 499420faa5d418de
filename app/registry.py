"""Strategy name -> (strategy class, client class): the one place methods are wired up."""

from __future__ import annotations

from dataclasses import dataclass

from clients import TorchClient
from strategies import PersonalisedFedAvg


@dataclass(frozen=True)
class Method:
    """A federated method: the server's strategy class and the clients' class."""

    strategy_class: type
    client_class: type


METHODS: dict[str, Method] = {
    "fedavg": Method(strategy_class=PersonalisedFedAvg, client_class=TorchClient),
}
STRATEGY_NAMES = tuple(METHODS)
