"""The pFedMe strategy: averaging with the server's step beta; the personal models stay on the clients."""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy
from strategies.contracts.payload import Scalar
from strategies.contracts.pfedme import CONTRACT
from strategies.screening.replies import Reply


class PFedMeServer(FederatedStrategy):
    """pFedMe (T. Dinh, Tran, Nguyen, NeurIPS 2020), Algorithm 1, on Flower.

    Each round the sampled clients (``clients.pfedme.PFedMeClient``) receive ``w`` with the
    shared keys and ``pfedme-lambda``, ``-personal-lr``, ``-inner-steps``; the server sets
    ``w <- w + beta (avg(w_k) - w)`` (``avg``: the shared averaging, ``aggregation``;
    ``beta = 1`` keeps the average itself). Evaluation tests each client's personal model
    ``theta_k`` as it is (a client never sampled tests ``w``), beside ``w``
    (``global-accuracy``); ``adapt-steps`` is sent as 0.
    """

    contract = CONTRACT

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        previous = self.global_shared
        averaged, extra = super().combine(server_round, replies)
        beta = self.method.beta
        if averaged is None or beta == 1.0:
            return averaged, extra
        return [w + beta * (a - w) for w, a in zip(previous, averaged, strict=True)], extra
