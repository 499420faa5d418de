"""The Ditto strategy: FedAvg for the global model; the personal models live on the clients."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.ditto import CONTRACT


class Ditto(FederatedStrategy):
    """Ditto (Li, Hu, Beirami, Smith, ICML 2021), Algorithm 1, on Flower.

    The server is FedAvg's: it samples, sends the global model ``w^t`` with the shared
    training keys and ``ditto-lambda``, ``ditto-personal-lr``, ``ditto-personal-steps``,
    and averages the returned global updates. Each client (``clients.ditto.DittoClient``)
    also keeps a personal model ``v_k`` in its ``Context.state`` and updates it with the
    regulariser ``lambda/2 ||v_k - w^t||^2``; evaluation tests ``v_k`` (a client never
    sampled tests ``w^t``) with no adaptation step, so ``adapt-steps`` is sent as 0.
    """

    contract = CONTRACT
