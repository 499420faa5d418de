"""The FedProto strategy: average the clients' class prototypes, weighted by their class counts."""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy
from strategies.contracts.fedproto import CONTRACT, COUNTS, PROTOTYPES, prototype_shape
from strategies.contracts.payload import Scalar
from strategies.screening.replies import Reply


def global_prototypes(prototypes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``C^j = sum_k n_k^j c_k^j / sum_k n_k^j`` over the clients (axis 0) holding class ``j``, and ``sum_k n_k^j``.

    Classes no client holds get a zero row and a count of 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    weighted = (counts[:, :, None] * np.asarray(prototypes, dtype=np.float64)).sum(axis=0)
    return (weighted / np.maximum(total, 1.0)[:, None]).astype(np.float32), total.astype(np.float32)


class FedProtoServer(FederatedStrategy):
    """FedProto (Tan et al., AAAI 2022), Algorithm 1, on Flower: no model travels.

    The contract keeps every client's whole model at home (``WholeModel``); each fit
    message carries the global prototypes and their counts, each reply the client's own.
    The server's new prototypes come from the round's replies alone (a class no sampled
    client holds has none that round, as in the paper). Evaluation tests each client's
    own model as it is (``adapt-steps`` 0).
    """

    contract = CONTRACT

    def start(self) -> None:
        classes, size = prototype_shape(self.layout)
        self.prototypes = np.zeros((classes, size), np.float32)
        self.counts = np.zeros(classes, np.float32)

    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]:
        return {PROTOTYPES: [self.prototypes], COUNTS: [self.counts]} if purpose == "fit" else {}

    def payload_shapes(self, name: str) -> list[tuple[int, ...]]:
        return [self.prototypes.shape if name == PROTOTYPES else self.counts.shape]

    def payload_dtypes(self, name: str) -> list[np.dtype]:
        return [self.prototypes.dtype if name == PROTOTYPES else self.counts.dtype]

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        """The new global prototypes; no model to change (``[]``: none of its arrays travels)."""
        if replies:
            self.prototypes, self.counts = global_prototypes(
                np.stack([r.extras[PROTOTYPES][0] for r in replies]), np.stack([r.extras[COUNTS][0] for r in replies])
            )
        return [], {"fedproto-classes": int((self.counts > 0).sum())}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        return {"fedproto/prototypes": self.prototypes.copy(), "fedproto/counts": self.counts.copy()}, {}
