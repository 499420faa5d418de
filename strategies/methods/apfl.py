"""The APFL strategy: FedAvg of the clients' copies of the global model; the mixtures stay on the clients."""

from __future__ import annotations

from strategies.base import FederatedStrategy
from strategies.contracts.apfl import CONTRACT


class Apfl(FederatedStrategy):
    """APFL (Deng, Kamani, Mahdavi, 2020), Algorithm 1, on Flower.

    The server is FedAvg's: it sends ``w`` with the shared keys and ``apfl-alpha``,
    ``apfl-alpha-lr``, and averages the returned ``w_k``. Each client
    (``clients.apfl.ApflClient``) also keeps a local model ``v_k`` and its mixing weight
    ``alpha_k`` in ``Context.state``. Evaluation tests each client's personalised model
    ``alpha_k v_k + (1 - alpha_k) w`` as it is, beside ``w`` (``global-accuracy``); a client
    never sampled tests ``w``; ``adapt-steps`` is sent as 0. The record keeps the mixing
    weights' mean, min and max (``apfl-mixing-*``).
    """

    contract = CONTRACT
