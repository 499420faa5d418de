"""Ditto's contract: the regulariser's weight and the personal model's own step size and steps (ALGORITHMS.md 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.common import MAX_EPOCHS, MAX_STEPS
from strategies.contracts.contract import Contract, MethodSettings, Metric
from strategies.contracts.keys import key

PERSONAL_LOSS, PERSONAL_ROUNDS = "ditto-personal-loss", "ditto-personal-rounds"


@dataclass(frozen=True, kw_only=True)
class DittoSettings(MethodSettings):
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1): FedAvg plus a personal model per client.

    A sampled client runs FedAvg's local update from the global model ``w^t`` (shared
    ``lr``, ``local-steps`` or ``local-epochs``, ``batch-size``) and returns it; it then
    takes ``ditto-personal-steps`` steps (or ``ditto-personal-epochs`` passes over its data)
    of size ``ditto-personal-lr`` on its personal model ``v_k``, on
    ``F_k(v) + lambda/2 ||v - w^t||^2``, and keeps ``v_k`` for the next round. Personalised
    evaluation tests ``v_k`` as it is.
    """

    prefix: ClassVar[str] = "ditto"

    lambda_: float = key(0.1, "weight of the regulariser lambda/2 ||v - w_global||^2 (0: purely local models)",
                         at_least=0)  # fmt: skip
    personal_lr: float = key(0.05, "step size of the personal model's updates", above=0)
    personal_steps: int = key(10, "personal-model steps each time the client is sampled", at_least=1,
                              at_most=MAX_STEPS)  # fmt: skip
    personal_epochs: float = key(0.0, "if > 0: passes over the local data for the personal model instead of "
                                 "ditto-personal-steps", at_least=0, at_most=MAX_EPOCHS)  # fmt: skip


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="ditto",
    adapts_at_test=False,
    summary="Ditto: FedAvg, plus a personal model per client pulled towards the global one",
    settings=DittoSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    step_sizes=("lr", "ditto-personal-lr"),
    metrics=(
        Metric(PERSONAL_LOSS, "mean training loss of the personal model's steps", 0.0),
        Metric(PERSONAL_ROUNDS, "times this client has updated its personal model", 1.0, summary=("sum",)),
    ),
    example={"strategy": "ditto", "ditto-lambda": 0.5, "fraction-fit": 1.0},
    keeps="its personal model v_k",
)
