"""The FedPer strategy: FedAvg of the shared body; the heads stay on the clients."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.fedper import CONTRACT


class FedPer(FederatedStrategy):
    """FedPer (Arivazhagan et al., 2019) on Flower.

    The contract keeps the model's last ``fedper-personal-layers`` layers on the clients, so
    the base sends, screens and averages the body alone; each client
    (``clients.fedper.FedPerClient``) merges the head it kept in ``Context.state`` (its
    initial one, the first time), trains both with local SGD and returns the body.
    Evaluation tests each client's own model, the body received with its head, as it is
    (``adapt-steps`` is sent as 0); no global model is tested (there is no global head).
    """

    contract = CONTRACT
