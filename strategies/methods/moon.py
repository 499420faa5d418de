"""The MOON strategy: FedAvg; the contrastive loss lives in the client."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.moon import CONTRACT


class Moon(FederatedStrategy):
    """MOON (Li, He, Song, CVPR 2021), Algorithm 1, on Flower: the server is FedAvg's.

    It sends the global model with ``moon-mu`` and ``moon-temperature``; each client
    (``clients.moon.MoonClient``) trains with the model-contrastive loss and returns its
    model, and the server averages them (``aggregation``). Evaluation is the shared
    personalised one.
    """

    contract = CONTRACT
