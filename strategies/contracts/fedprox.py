"""FedProx's contract: one key, the weight of the proximal term (ALGORITHMS.md section 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.keys import key


@dataclass(frozen=True, kw_only=True)
class FedProxSettings(MethodSettings):
    """FedProx (Li et al., MLSys 2020): local SGD on ``F_k(w) + mu/2 ||w - w_global||^2``.

    ``fedprox-mu = 0`` is FedAvg exactly. Its clients also read the shared ``lr``,
    ``local-steps`` or ``local-epochs`` and ``batch-size``.
    """

    prefix: ClassVar[str] = "fedprox"

    mu: float = key(0.01, "weight of the proximal term mu/2 ||w - w_global||^2 (0: FedAvg)", at_least=0)


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="fedprox",
    summary="FedProx: FedAvg whose clients keep near the global model with a proximal term",
    settings=FedProxSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    example={"strategy": "fedprox", "fedprox-mu": 0.1},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
