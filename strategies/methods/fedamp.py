"""The FedAMP strategy: keep every client's last model; send each client its own cloud model u_i."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import flatten, unflatten
from strategies.base import FederatedStrategy
from strategies.contracts.fedamp import CONTRACT
from strategies.contracts.payload import Scalar
from strategies.methods.fedamp_math import attention_row, worst_self_weight
from strategies.rounds.checkpoint import CheckpointError
from strategies.screening.replies import Reply


class FedAmpServer(FederatedStrategy):
    """FedAMP (Huang et al., AAAI 2021), Algorithm 1, on Flower.

    The server keeps every client's last model ``w_j`` (the initial model until the client
    first trains). Once a round's clients are chosen (``begin_round``) it computes each
    one's cloud model ``u_i = sum_j xi_ij w_j`` over all kept models
    (:func:`strategies.methods.fedamp_math.attention_row`) and sends it; the client
    (``clients.fedamp.FedAmpClient``) trains from ``u_i`` with the proximal term and
    returns ``w_i``, which replaces the kept one. Evaluation sends each client its own
    ``w_i`` and tests it as it is. The global model recorded and checkpointed is the mean
    of the kept models. The server holds ``K`` model copies and each ``u_i`` costs
    ``O(K P)``: at 50 clients of the MLP, 13.6 MB and 3.4 M multiply-adds per client.
    """

    contract = CONTRACT

    def start(self) -> None:
        self.kept: dict[int, np.ndarray] = {}  # partition -> its last model, flat (float32)
        self.cloud: dict[int, list[np.ndarray]] = {}  # this round's u_i (fit) or w_i (evaluate), by partition
        partitions = sorted({self.nodes.partition_of(node) for node in self.nodes.properties})
        self._keep_new(partitions)
        method = self.method
        worst = worst_self_weight(max(len(self.kept), 1), alpha=method.alpha_k, sigma=method.sigma,
                                  attention=method.attention)  # fmt: skip
        if worst < 0:
            raise RuntimeError(
                f"run config key 'fedamp-alpha-k': with exponential attention over {len(self.kept)} clients a "
                f"self-weight xi_ii can reach {worst:.3g} (alpha-k (K - 1) / sigma > 1) and u_i would extrapolate; "
                f"set fedamp-alpha-k at most {method.sigma / max(len(self.kept) - 1, 1):.3g} or raise fedamp-sigma"
            )

    def _keep_new(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.kept.setdefault(partition, flatten(self.global_model))

    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]:
        """Each chosen partition's model: ``u_i`` for ``fit``, its own ``w_i`` for ``evaluate``; least self-weight."""
        self._keep_new([*self.connected_partitions, *partitions])
        order = sorted(self.kept)
        if purpose == "evaluate":
            self.cloud = {p: unflatten(self.kept[p].copy(), self.shapes) for p in partitions}
            return {}
        stacked = np.stack([self.kept[p] for p in order])
        method, self.cloud, self_weights = self.method, {}, []
        for partition in partitions:
            i = order.index(partition)
            row = attention_row(stacked, i, alpha=method.alpha_k, sigma=method.sigma, attention=method.attention)
            cloud = (row @ stacked).astype(np.float32)
            if not np.all(np.isfinite(cloud)):  # finite models can still mix past float32's range
                log(WARNING, "round %s: partition %s's cloud model u_i is non-finite; it is sent its own model w_i",
                    server_round, partition)  # fmt: skip
                cloud, row = self.kept[partition].copy(), np.eye(len(order))[i]
            self.cloud[partition] = unflatten(cloud, self.shapes)
            self_weights.append(float(row[i]))
        # how much of u_i is the client's own model: 1 means no collaboration
        return {"fedamp-self-weight-min": min(self_weights)} if self_weights else {}

    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]:
        return self.cloud[partition]

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        """Each reply's ``w_i`` replaces its kept model; the global model is the mean of the kept ones."""
        if not replies:
            return None, {}
        for reply in replies:
            self.kept[reply.partition] = flatten(reply.arrays)
        mean = np.mean(np.stack(list(self.kept.values())), axis=0, dtype=np.float64).astype(np.float32)
        return unflatten(mean, self.shapes), {}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        order = sorted(self.kept)
        return {"fedamp/kept": np.stack([self.kept[p] for p in order])}, {"partitions": order}

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        kept = arrays.get("fedamp/kept")
        if kept is None or len(kept) != len(state.get("partitions", ())):
            raise CheckpointError("checkpoint holds no FedAMP models (fedamp/kept) for its partitions")
        self.kept = {int(p): row.astype(np.float32) for p, row in zip(state["partitions"], kept, strict=True)}
