"""APFL's contract: the mixing weight of the local and global models, and its step size (ALGORITHMS.md 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Metric
from strategies.contracts.keys import key

MIXING, PERSONAL_LOSS = "apfl-mixing", "apfl-personal-loss"


@dataclass(frozen=True, kw_only=True)
class ApflSettings(MethodSettings):
    """APFL (Deng, Kamani, Mahdavi, 2020), Algorithm 1: a local model mixed with the global one.

    Each client keeps a local model ``v_k`` and a mixing weight ``alpha_k`` (``apfl-alpha``
    at first); its personalised model is ``vbar_k = alpha_k v_k + (1 - alpha_k) w_k``. Each
    local step on a batch, from the values before the step: ``w_k <- w_k - lr grad F_k(w_k)``,
    ``v_k <- v_k - lr alpha_k grad F_k(vbar_k)`` and, when ``apfl-alpha-lr`` > 0,
    ``alpha_k <- clip(alpha_k - apfl-alpha-lr <v_k - w_k, grad F_k(vbar_k)>, 0, 1)``.
    It returns ``w_k``; the server averages.
    """

    prefix: ClassVar[str] = "apfl"

    alpha: float = key(0.25, "alpha_k's starting value: the local model's weight in the personalised model",
                       at_least=0, at_most=1)  # fmt: skip
    alpha_lr: float = key(0.05, "step size of alpha_k's own gradient step (0: alpha stays at apfl-alpha)",
                          at_least=0)  # fmt: skip


CONTRACT = Contract(
    asynchronous="global",  # buffered replies are rebased onto the newest global model (docs/fleets.md)
    name="apfl",
    adapts_at_test=False,
    summary="APFL: each client mixes a local model of its own with the global one, and learns the mixing weight",
    settings=ApflSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    metrics=(
        Metric(MIXING, "alpha_k after the round: the local model's weight in the personalised one", 0.0, 1.0,
               summary=("mean", "min", "max")),
        Metric(PERSONAL_LOSS, "mean training loss of the personalised model vbar_k over the local steps", 0.0),
    ),
    example={"strategy": "apfl", "fraction-fit": 0.5},
    keeps="its local model v_k and mixing weight alpha_k",
)
