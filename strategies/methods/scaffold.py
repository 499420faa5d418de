"""The SCAFFOLD strategy: the global model and a control variate ``c``, sent together, updated together."""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedStrategy
from strategies.contracts.common import AVERAGES
from strategies.contracts.payload import Scalar
from strategies.contracts.scaffold import CONTRACT, CONTROL, DELTA_CONTROL
from strategies.screening.replies import Reply


class ScaffoldServer(FederatedStrategy):
    """SCAFFOLD (Karimireddy et al., ICML 2020), Algorithm 1 with option II, on Flower.

    The server keeps the control variate ``c`` (zero at first, shaped like the model) and
    sends it beside the model with every fit instruction (``control``; evaluations get the
    model alone). From the accepted replies ``S`` (``clients.scaffold.ScaffoldClient``)
    it sets ``x <- x + eta_g (avg(y) - x)``, ``avg`` being the shared averaging
    (``aggregation``; uniform by default, as in the paper), and
    ``c <- c + |S| / N mean_S(delta-control)``, ``N`` being the partitions connected this
    round, ``mean_S`` weighing the replies as ``avg`` does (with ``aggregation = "examples"``
    both are example-weighted, so that ``c`` tracks the gradient of the objective ``x``
    descends). A reply without its ``delta-control``, or with a bad one, is rejected by the
    base's screening. The record adds ``scaffold-control-norm`` (``||c||``).

    A checkpoint does not keep ``c``: the clients' ``c_i`` live in ``Context.state``, which a
    resumed run (a new Flower run) starts empty, and ``c`` restarts at 0 with them, so that
    it stays the mean of the ``c_i`` it was built from.
    """

    contract = CONTRACT

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.control = [np.zeros_like(a) for a in self.global_shared]

    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]:
        return {CONTROL: self.control} if purpose == "fit" else {}

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        if not replies:
            return None, {}
        share = len(replies) / max(len(self.connected_partitions), len(replies))  # |S| / N
        deltas = [reply.extras[DELTA_CONTROL] for reply in replies]
        # c estimates the gradient of the objective the models' average descends: the same weights for both
        # (uniform: the paper's mean; examples: the example-weighted objective), or the correction pulls elsewhere
        if self.settings.run.aggregation in AVERAGES:
            weights = self.averaging_weights(replies)
            mean = [np.average(np.asarray(layer, dtype=np.float64), axis=0, weights=weights)
                    for layer in zip(*deltas, strict=True)]  # fmt: skip
        else:  # a robust rule: the corrections are combined as robustly as the models they correct
            mean = self.average([[np.array(d, copy=True) for d in delta] for delta in deltas], replies,
                                server_round=server_round, center=[np.zeros_like(d) for d in deltas[0]])
        # c keeps the model's dtypes (a BatchNorm counter's stays an integer): replies are screened against them
        self.control = [(c + share * np.asarray(m).astype(c.dtype)).astype(c.dtype, copy=False)
                        for c, m in zip(self.control, mean, strict=True)]  # fmt: skip
        previous = self.global_shared
        averaged, extra = super().combine(server_round, replies)
        eta = self.method.server_lr
        if eta != 1.0:  # x + eta (avg - x); eta = 1 keeps the average itself, bit for bit
            averaged = [x + eta * (a - x) for x, a in zip(previous, averaged, strict=True)]
        norm = float(np.sqrt(sum(float(np.vdot(c, c)) for c in self.control)))
        return averaged, {**extra, "scaffold-control-norm": norm}

    def divergence_hint(self) -> str:
        """The step size, with how ``||c||`` grew: too large an lr makes the corrections feed on themselves.

        Non-finite replies never reach ``combine`` (the base's screening rejects them), so
        ``c`` stays what the last accepted round made it; B7 (FEMNIST, lr 0.1) measured
        ``||c||`` at 0.10 in round 30 and 4,308 in round 90, before the replies turned non-finite.
        """
        norms = [r["scaffold-control-norm"] for r in self.history
                 if isinstance(r.get("scaffold-control-norm"), float) and np.isfinite(r["scaffold-control-norm"])]
        if len(norms) < 2:
            return super().divergence_hint()
        return (f"most likely the cause: lower lr (the control variate's norm ||c|| went from {norms[0]:.3g} in the "
                f"first round to {max(norms):.3g}; SCAFFOLD usually needs a smaller lr than FedAvg)")  # fmt: skip
