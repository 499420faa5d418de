"""The FedRep strategy: FedAvg of the shared representation (the body); the heads stay on the clients."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.fedrep import CONTRACT


class FedRep(FederatedStrategy):
    """FedRep (Collins et al., ICML 2021), Algorithm 1, on Flower.

    The contract keeps the model's last ``fedrep-personal-layers`` layers on the clients, so
    the base sends, screens and averages the body alone; each client
    (``clients.fedrep.FedRepClient``) fits its head with the body frozen, then the body
    with its head frozen, and returns the body. Evaluation tests each client's own model,
    the body received with its head, as it is (``adapt-steps`` is sent as 0); no global
    model is tested (there is no global head).
    """

    contract = CONTRACT
