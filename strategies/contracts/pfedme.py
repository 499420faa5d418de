"""pFedMe's contract: the Moreau envelope's weight, the personal problem's solver, the server's step (ALGORITHMS 5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.common import MAX_STEPS
from strategies.contracts.contract import Contract, MethodSettings, Metric
from strategies.contracts.keys import key

PERSONAL_DISTANCE = "pfedme-personal-distance"


@dataclass(frozen=True, kw_only=True)
class PFedMeSettings(MethodSettings):
    """pFedMe (T. Dinh, Tran, Nguyen, NeurIPS 2020), Algorithm 1: personalisation by Moreau envelopes.

    A sampled client sets ``w_k = w`` and ``theta = w``; for each of the shared
    ``local-steps`` (R) it draws a batch D of ``batch-size``, takes ``pfedme-inner-steps``
    (K) gradient steps of size ``pfedme-personal-lr`` on ``f_k(theta; D) + lambda/2
    ||theta - w_k||^2``, then ``w_k <- w_k - lr lambda (w_k - theta)``. It returns ``w_k``
    and keeps ``theta`` as its personal model. The server sets ``w <- (1 - beta) w +
    beta mean(w_k)``. Defaults: the paper's MNIST setting (lambda 15, personal step 0.1, K 5, beta 1).
    """

    prefix: ClassVar[str] = "pfedme"

    lambda_: float = key(15.0, "lambda, the weight of ||theta - w||^2 tying the personal model to the local one",
                         above=0)  # fmt: skip
    personal_lr: float = key(0.1, "the personal model's step size in the inner problem", above=0)
    inner_steps: int = key(5, "K, gradient steps on the inner problem per local step", at_least=1, at_most=MAX_STEPS)
    beta: float = key(1.0, "the server's step w <- (1 - beta) w + beta mean(w_k) (1: the models' average)", above=0,
                      server_only=True)  # fmt: skip


CONTRACT = Contract(
    name="pfedme",
    adapts_at_test=False,
    summary="pFedMe: each client's personal model solves a proximal problem around its local copy of the global one",
    settings=PFedMeSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    step_sizes=("lr", "pfedme-personal-lr"),
    metrics=(Metric(PERSONAL_DISTANCE, "||theta_k - w_k|| after the local rounds: how far personalisation went", 0.0),),
    example={"strategy": "pfedme", "fraction-fit": 0.5, "local-steps": 5},
    keeps="its personal model theta_k",
)
