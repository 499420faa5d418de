"""FedRep's contract: the head each client keeps, and its local steps on it before the body's (ALGORITHMS.md 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.common import MAX_EPOCHS, MAX_STEPS
from strategies.contracts.contract import Contract, MethodSettings, Metric
from strategies.contracts.keys import key
from strategies.contracts.personal import LastLayers

HEAD_LOSS = "fedrep-head-loss"


@dataclass(frozen=True, kw_only=True)
class FedRepSettings(MethodSettings):
    """FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021), Algorithm 1: a shared representation.

    A sampled client first takes ``fedrep-head-steps`` SGD steps (or ``fedrep-head-epochs``
    passes over its data) on its head with the body it received frozen, then the shared
    ``local-steps`` (or ``local-epochs``) on the body with its head frozen, both with the
    shared ``lr`` and ``batch-size``; it returns the body and keeps the head. The server averages the bodies.
    """

    prefix: ClassVar[str] = "fedrep"

    personal_layers: int = key(1, "the model's last layers each client keeps as its own head (the rest is shared)",
                               at_least=1)  # fmt: skip
    head_steps: int = key(10, "tau_h: SGD steps on the head, body frozen, before the body's local-steps",
                          at_least=1, at_most=MAX_STEPS)  # fmt: skip
    head_epochs: float = key(0.0, "if > 0: passes over the local data on the head instead of fedrep-head-steps",
                             at_least=0, at_most=MAX_EPOCHS)  # fmt: skip


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="fedrep",
    adapts_at_test=False,
    summary="FedRep: a shared body learnt by all; each client fits its own head first, then the body",
    settings=FedRepSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    personal=LastLayers("fedrep-personal-layers"),
    metrics=(Metric(HEAD_LOSS, "mean training loss of the head's steps", 0.0),),
    example={"strategy": "fedrep", "fraction-fit": 0.5, "fedrep-head-steps": 5},
)
