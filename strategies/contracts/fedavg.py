"""FedAvg's contract: no keys of its own; its clients run local SGD with the shared training keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable


@dataclass(frozen=True, kw_only=True)
class FedAvgSettings(MethodSettings):
    """FedAvg (McMahan et al., 2017): only the shared ``lr``, ``local-steps`` or ``local-epochs``, ``batch-size``."""

    prefix: ClassVar[str] = "fedavg"


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="fedavg",
    summary="FedAvg with personalised evaluation: the paper's 'FedAvg + update' baseline",
    settings=FedAvgSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    example={"strategy": "fedavg"},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
