"""MOON's contract: the weight and temperature of its model-contrastive loss on the representation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.keys import key


@dataclass(frozen=True, kw_only=True)
class MoonSettings(MethodSettings):
    """MOON (Li, He, Song, CVPR 2021): local SGD on ``CE + mu * l_con`` over the representation ``z = features(x)``.

    ``l_con = -log(e^(sim(z, z_glob)/tau) / (e^(sim(z, z_glob)/tau) + e^(sim(z, z_prev)/tau)))``
    with ``sim`` the cosine, ``z_glob`` the representation under the global model received
    and ``z_prev`` under the client's model after its previous round (kept in ``Context.state``).
    """

    prefix: ClassVar[str] = "moon"

    mu: float = key(1.0, "weight of the model-contrastive loss (the paper tunes it in {0.1, 1, 5, 10})", at_least=0)
    temperature: float = key(0.5, "tau, the temperature of the contrastive loss (the paper's 0.5)", above=0)


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="moon",
    summary="MOON: FedAvg whose clients pull their representation towards the global model's and away from "
            "their previous one's",
    settings=MoonSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    representation=True,  # it trains on features(x): a model with the split
    example={"strategy": "moon", "fraction-fit": 0.5, "moon-mu": 1.0},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
    keeps="its model after its previous round (MOON's z_prev)",
)
