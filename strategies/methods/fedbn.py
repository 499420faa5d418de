"""The FedBN strategy: FedAvg of every array but the BatchNorm layers', which stay on the clients."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.fedbn import CONTRACT


class FedBN(FederatedStrategy):
    """FedBN (Li et al., ICLR 2021), Algorithm 1, on Flower.

    The contract keeps every BatchNorm array on the clients (``NormLayers``), so the base
    sends, screens and averages the rest; each client (``clients.fedbn.FedBNClient``)
    merges the BatchNorm layers it kept (their initial values, the first time), trains with
    local SGD and returns the rest. Evaluation tests each client's own model, as it is
    (``adapt-steps`` 0): the shared weights under its own normalisation.
    """

    contract = CONTRACT
