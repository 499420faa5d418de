"""FedBN's contract: every BatchNorm array stays on its client; the rest is FedAvg (Li et al., ICLR 2021)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.personal import NormLayers


@dataclass(frozen=True, kw_only=True)
class FedBNSettings(MethodSettings):
    """FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021): FedAvg that keeps the BatchNorm layers local.

    A sampled client trains its whole model with local SGD (the shared ``lr``,
    ``local-steps`` or ``local-epochs``, ``batch-size``); its BatchNorm weights, biases,
    running statistics and step counters never leave it. The server averages the rest.
    No keys of its own; it needs a model with BatchNorm (``fedavg-cnn-bn``, ``resnet18``).
    """

    prefix: ClassVar[str] = "fedbn"


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="fedbn",
    adapts_at_test=False,
    summary="FedBN: FedAvg whose clients keep their BatchNorm layers (weights and running statistics) at home",
    settings=FedBNSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    personal=NormLayers(),
    example={"strategy": "fedbn", "model": "fedavg-cnn-bn", "fraction-fit": 0.5, "local-steps": 4},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
