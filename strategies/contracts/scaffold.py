"""SCAFFOLD's contract: the server's step, and the control variates that travel beside the model (ALGORITHMS.md 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Metric, Tunable
from strategies.contracts.keys import key
from strategies.contracts.payload import ArraySet

CONTROL, DELTA_CONTROL = "control", "delta-control"
CORRECTION_NORM = "scaffold-correction-norm"


@dataclass(frozen=True, kw_only=True)
class ScaffoldSettings(MethodSettings):
    """SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 with option II.

    The server sends the global model ``x`` and its control variate ``c``; a sampled
    client runs ``K`` steps ``y <- y - lr (g(y) - c_i + c)`` with the shared ``lr``,
    ``local-steps`` or ``local-epochs`` and ``batch-size``, updates its own control
    variate ``c_i+ = c_i - c + (x - y) / (K lr)`` and returns ``y`` and ``c_i+ - c_i``.
    The server sets ``x <- x + eta_g mean(y - x)`` and ``c <- c + |S|/N mean(c_i+ - c_i)``.
    """

    prefix: ClassVar[str] = "scaffold"

    server_lr: float = key(1.0, "eta_g, the server's step x <- x + eta_g mean(y - x) (1: the models' average)",
                           above=0, server_only=True)  # fmt: skip


CONTRACT = Contract(
    name="scaffold",
    summary="SCAFFOLD: local steps corrected by control variates against client drift",
    settings=ScaffoldSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    sends=(ArraySet(CONTROL, "the server's control variate c, shaped like the model"),),
    returns=(ArraySet(DELTA_CONTROL, "c_i+ - c_i: how the client's control variate moved this round", kind="update"),),
    metrics=(Metric(CORRECTION_NORM, "||c - c_i||, the drift correction the client's steps applied", 0.0,
                    summary=("mean", "max")),),  # fmt: skip
    example={"strategy": "scaffold", "fraction-fit": 0.5},
    keeps="its control variate c_i (the server's c restarts at 0 with them)",
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
