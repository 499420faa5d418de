"""The methods stamen knows: one line each, a strategy class and the client class that serves it."""

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
from strategies.methods.apfl import Apfl
from strategies.methods.diffusion import Diffusion
from strategies.methods.ditto import Ditto
from strategies.methods.fathom import Fathom
from strategies.methods.fedamp import FedAmp
from strategies.methods.fedavg import FedAvg
from strategies.methods.fedbn import FedBN
from strategies.methods.fedper import FedPer
from strategies.methods.fedproto import FedProto
from strategies.methods.fedprox import FedProx
from strategies.methods.fedrep import FedRep
from strategies.methods.moon import Moon
from strategies.methods.perfedavg import PerFedAvg
from strategies.methods.pfedme import PFedMe
from strategies.methods.scaffold import Scaffold


@dataclass(frozen=True)
class Method:
    """A federated method: its strategy (server) and its client, which must share one contract."""

    strategy: type[FederatedStrategy]
    client: type[TorchClient]

    def __post_init__(self) -> None:
        if self.client.contract is not self.strategy.contract:
            raise TypeError(f"{self.strategy.__name__} and {self.client.__name__} have different contracts "
                            f"({self.strategy.contract.name!r}, {self.client.contract.name!r})")  # fmt: skip

    @property
    def contract(self) -> Contract:
        return self.strategy.contract

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
    named: dict[str, Method] = {}
    for method in methods:
        if method.contract.name in named:
            raise ValueError(f"two methods are named {method.contract.name!r}")
        named[method.contract.name] = method
    return named


METHODS = by_name(
    Method(FedAvg, FedAvgClient),
    Method(PerFedAvg, PerFedAvgClient),
    Method(Fathom, FathomClient),
    Method(Diffusion, DiffusionClient),
    Method(FedProx, FedProxClient),
    Method(Ditto, DittoClient),
    Method(Scaffold, ScaffoldClient),
    Method(FedRep, FedRepClient),
    Method(FedPer, FedPerClient),
    Method(PFedMe, PFedMeClient),
    Method(Apfl, ApflClient),
    Method(FedBN, FedBNClient),
    Method(Moon, MoonClient),
    Method(FedAmp, FedAmpClient),
    Method(FedProto, FedProtoClient),
)
CONTRACTS = {name: method.contract for name, method in METHODS.items()}


def method_named(name: str) -> Method:
    """The registered method ``name`` (the ``strategy`` key's value): its ``strategy`` and ``client`` classes, ``keys``.

    Raises
    ------
    ConfigError
        For a name no method has, listing those that exist.

    """
    if name not in METHODS:
        raise ConfigError(f"run config key 'strategy': {name!r} is not a method; choose one of {list(METHODS)}")
    return METHODS[name]
