"""FedAMP's contract: the attention that builds each client's cloud model, and the proximal pull towards it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from strategies.contracts.contract import Contract, MethodSettings, Tunable
from strategies.contracts.keys import ConfigError, key

ATTENTIONS = ("cosine", "exponential")


@dataclass(frozen=True, kw_only=True)
class FedAmpSettings(MethodSettings):
    """FedAMP (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, AAAI 2021): attentive message passing between clients.

    The server keeps every client's last model ``w_j`` and sends client ``i`` its own cloud
    model ``u_i = sum_j xi_ij w_j``; the client trains on ``F_i(w) + lambda / (2 alpha_k)
    ||w - u_i||^2`` from ``u_i`` and returns ``w_i``.
    """

    prefix: ClassVar[str] = "fedamp"

    attention: str = key("cosine", "how xi_ij (j != i) is weighed: cosine (the released code: softmax of sigma x "
                         "cos(w_i, w_j) over the other clients, summing to alpha-k) or exponential (the paper: "
                         "alpha-k e^(-||w_i - w_j||^2 / sigma) / sigma)", choices=ATTENTIONS, server_only=True)
    alpha_k: float = key(0.5, "alpha_k: the weight the other clients' models share in u_i (cosine; the self-weight "
                         "is 1 - alpha_k), or the scale of each one's (exponential); also divides lambda",
                         above=0)  # fmt: skip
    sigma: float = key(1.0, "cosine: the sharpness of the preference for similar models; exponential: the "
                       "squared distance at which attention falls by e", above=0, server_only=True)  # fmt: skip
    lambda_: float = key(1.0, "lambda: the proximal weight is lambda / alpha_k, pulling w_i towards u_i", at_least=0)

    def check(self) -> None:
        if self.attention == "cosine" and self.alpha_k > 1:
            raise ConfigError(f"run config key 'fedamp-alpha-k': {self.alpha_k} is above 1; with cosine attention "
                              "the other clients share alpha-k of u_i and the client keeps 1 - alpha-k")  # fmt: skip


CONTRACT = Contract(
    robust_aggregation=False,  # FedAMP combines by its attention weights
    name="fedamp",
    adapts_at_test=False,
    summary="FedAMP: the server sends each client its own attention-weighted mix of every client's last model, "
            "which the client's proximal term pulls towards",
    settings=FedAmpSettings,
    uses=("lr", "local-steps", "local-epochs", "batch-size"),
    example={"strategy": "fedamp", "fraction-fit": 0.5},
    tunable=Tunable(step="lr", work=("local-epochs", "local-steps")),
)
