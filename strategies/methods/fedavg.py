"""FedAvg with personalised evaluation: the base strategy with FedAvg's contract, nothing overridden."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.fedavg import CONTRACT


class FedAvg(FederatedStrategy):
    """FedAvg (McMahan et al., 2017) evaluated the personalised way: the paper's "FedAvg + update".

    Each round the sampled clients (``clients.fedavg.FedAvgClient``) receive the global
    model with ``lr``, ``local-steps``, ``local-epochs`` and ``batch-size``, run local SGD,
    and the server averages what they return (``aggregation``).
    """

    contract = CONTRACT
