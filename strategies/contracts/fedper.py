"""FedPer's contract: how many of the model's last layers each client keeps as its own head (ALGORITHMS.md 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.keys import key
from strategies.contracts.personal import LastLayers


@dataclass(frozen=True, kw_only=True)
class FedPerSettings(MethodSettings):
    """FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, 2019): a shared body, a personal head per client.

    A sampled client trains its whole model, the body it received and the head it kept,
    with local SGD (the shared ``lr``, ``local-steps`` or ``local-epochs``, ``batch-size``),
    returns the body and keeps the head. The server averages the bodies.
    """

    prefix: ClassVar[str] = "fedper"

    personal_layers: int = key(1, "the model's last layers each client keeps as its own head (the rest is shared)",
                               at_least=1)  # fmt: skip


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="fedper",
    adapts_at_test=False,
    summary="FedPer: FedAvg of the model's body; each client trains and keeps its own head",
    settings=FedPerSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    personal=LastLayers("fedper-personal-layers"),
    example={"strategy": "fedper", "fraction-fit": 0.5},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
