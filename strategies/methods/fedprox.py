"""The FedProx strategy: FedAvg that also sends its clients the proximal weight ``fedprox-mu``."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.fedprox import CONTRACT


class FedProx(FederatedStrategy):
    """FedProx (Li et al., MLSys 2020) on Flower.

    The server is FedAvg's: it samples, sends the global model ``w^t`` with ``lr``,
    ``local-steps``, ``local-epochs``, ``batch-size`` and ``fedprox-mu`` in the fit
    config, and averages the returned models (``aggregation``). What makes it FedProx
    is the client's work (``clients.fedprox.FedProxClient``): every local step uses
    ``grad F_k(w; batch) + mu (w - w^t)``, the gradient of the proximal objective
    ``F_k(w) + mu/2 ||w - w^t||^2``.
    """

    contract = CONTRACT
