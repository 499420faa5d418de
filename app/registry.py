"""The methods stamen knows: one line each, the client class and, where the method has server hooks, its server class.

A method whose server is the base's as it is (FedAvg, FedProx, Ditto, FedRep, FedPer, APFL,
FedBN, MOON: their contracts say all the server needs) names its client alone; the server
is :class:`strategies.base.FederatedStrategy` built with that contract (:meth:`Method.build`).
"""

from __future__ import annotations

from dataclasses import dataclass

from clients.apfl import ApflClient
from clients.base import TorchClient
from clients.diffusion import DiffusionClient
from clients.ditto import DittoClient
from clients.fathom import FathomClient
from clients.fedamp import FedAmpClient
from clients.fedavg import FedAvgClient
from clients.fedbn import FedBNClient
from clients.fedper import FedPerClient
from clients.fedproto import FedProtoClient
from clients.fedprox import FedProxClient
from clients.fedrep import FedRepClient
from clients.moon import MoonClient
from clients.perfedavg import PerFedAvgClient
from clients.pfedme import PFedMeClient
from clients.scaffold import ScaffoldClient
from strategies.base import FederatedStrategy
from strategies.contracts.contract import Contract
from strategies.contracts.keys import ConfigError
from strategies.contracts.naming import named_once
from strategies.methods.diffusion import DiffusionServer
from strategies.methods.fathom import FathomServer
from strategies.methods.fedamp import FedAmpServer
from strategies.methods.fedproto import FedProtoServer
from strategies.methods.perfedavg import PerFedAvgServer
from strategies.methods.pfedme import PFedMeServer
from strategies.methods.scaffold import ScaffoldServer


@dataclass(frozen=True)
class Method:
    """A federated method: its client, and its server class where it has hooks of its own; one contract for both."""

    client: type[TorchClient]
    server: type[FederatedStrategy] = FederatedStrategy

    def __post_init__(self) -> None:
        if self.server is not FederatedStrategy and self.client.contract is not self.server.contract:
            raise TypeError(f"{self.server.__name__} and {self.client.__name__} have different contracts "
                            f"({self.server.contract.name!r}, {self.client.contract.name!r})")  # fmt: skip

    @property
    def contract(self) -> Contract:
        return self.client.contract

    @property
    def class_name(self) -> str:
        """The method's public class name (``stamen.PerFedAvg``): its client's, less ``Client``."""
        return self.client.__name__.removesuffix("Client")

    def build(self, **options: object) -> FederatedStrategy:
        """The method's server object for a run: ``options`` are :class:`FederatedStrategy`'s (settings, model, ...)."""
        return self.server(contract=self.contract, **options)

    @property
    def name(self) -> str:
        """The value of the ``strategy`` key that selects it."""
        return self.contract.name

    @property
    def keys(self) -> tuple[str, ...]:
        """The run-config keys it reads besides the run's: the local-training keys it uses, then its own."""
        return (*self.contract.uses, *(spec.name for spec in self.contract.settings.key_specs()))


def by_name(*methods: Method) -> dict[str, Method]:
    """``{contract name: method}``, refusing two methods of one name."""
    return named_once(methods, lambda method: method.contract.name, "methods")


METHODS = by_name(
    Method(FedAvgClient),
    Method(PerFedAvgClient, PerFedAvgServer),
    Method(FathomClient, FathomServer),
    Method(DiffusionClient, DiffusionServer),
    Method(FedProxClient),
    Method(DittoClient),
    Method(ScaffoldClient, ScaffoldServer),
    Method(FedRepClient),
    Method(FedPerClient),
    Method(PFedMeClient, PFedMeServer),
    Method(ApflClient),
    Method(FedBNClient),
    Method(MoonClient),
    Method(FedAmpClient, FedAmpServer),
    Method(FedProtoClient, FedProtoServer),
)
CONTRACTS = {name: method.contract for name, method in METHODS.items()}


def method_named(name: str) -> Method:
    """The registered method ``name`` (the ``strategy`` key's value): its ``server`` and ``client`` classes, ``keys``.

    Raises
    ------
    ConfigError
        For a name no method has, listing those that exist.

    """
    if name not in METHODS:
        raise ConfigError(f"run config key 'strategy': {name!r} is not a method; choose one of {list(METHODS)}")
    return METHODS[name]
