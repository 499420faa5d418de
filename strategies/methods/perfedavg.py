"""The Per-FedAvg strategy: broadcast the meta-learning hyperparameters, average, adapt with alpha at test time."""

from __future__ import annotations

from logging import WARNING

from flwr.common.logger import log

from strategies.base import FederatedStrategy
from strategies.contracts.payload import Scalar
from strategies.contracts.perfedavg import CONTRACT


class PerFedAvgServer(FederatedStrategy):
    """Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020), Algorithm 1, on Flower.

    Each round the server samples ``fraction-fit`` of the clients and sends them the
    model with ``perfedavg-alpha``, ``-beta``, ``-delta``, ``-variant``, ``local-steps``
    (tau) and the sizes of D, D' and D'' in the fit config; each client
    (``clients.perfedavg.PerFedAvgClient``) runs tau meta-updates and the server
    averages the returned models (uniformly by default, as the paper does).
    Evaluation is personalised with the paper's test-time step: ``adapt-lr`` 0 means alpha.
    """

    contract = CONTRACT

    def hf_on_relu(self) -> str:
        """Why ``hf`` is unsafe here, when it runs on a ReLU model; else ``""``."""
        model = self.settings.training.model
        if self.method.variant != "hf" or self.settings.model_card.smooth:
            return ""
        return (f"perfedavg-variant 'hf' on model {model!r} (ReLU): the central difference of a "
                "piecewise-linear gradient is no Hessian estimate (10x the exact product's norm at the start, "
                "docs/methods/perfedavg.md#where-each-variant-is-safe); use 'so' or 'fo'")  # fmt: skip

    def start(self) -> None:
        if warning := self.hf_on_relu():
            log(WARNING, "%s", warning)

    def divergence_hint(self) -> str:
        return self.hf_on_relu() or super().divergence_hint()

    def evaluate_config(self) -> dict[str, Scalar]:
        """The paper's test-time step: alpha, the value in force when a tuner moves it (``adapt-lr`` 0)."""
        alpha = self.in_force("perfedavg-alpha", self.method.alpha)
        return {**super().evaluate_config(), "adapt-lr": self.settings.training.adapt_lr or alpha}
