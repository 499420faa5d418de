"""The hooks a method may override, with FedAvg's answers: what is sent, to whom, and how replies combine.

:class:`FedAvgHooks` is the base of :class:`strategies.base.FederatedStrategy`: each hook
here is FedAvg's (with personalised evaluation), and a method whose server differs
overrides the ones it needs (the table in ``docs/architecture.md``). The hooks read the
method's settings and members, which :class:`FederatedStrategy` sets up; they never call
what the round engine calls (``tests/test_registry.py``).
"""

from __future__ import annotations

from logging import WARNING
from typing import ClassVar

import numpy as np
from flwr.common.logger import log

from strategies.aggregation.rules import aggregate
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.payload import Scalar
from strategies.contracts.settings import Settings
from strategies.rounds.sampling import sample_partitions, sample_size
from strategies.screening.replies import Reply
from strategies.tuning.tuner import FathomTuner


class FedAvgHooks:
    """The hooks a method overrides, with FedAvg's answers (see the module's docstring).

    The annotations below are what the hooks read; :class:`strategies.base.FederatedStrategy` sets them.
    """

    contract: ClassVar[Contract]
    settings: Settings
    tuner: FathomTuner | None
    sent_shapes: list[tuple[int, ...]]
    sent_dtypes: list[np.dtype]
    float_layers: list[bool]
    global_shared: list[np.ndarray]  # the global model's arrays that travel (FederatedStrategy's property)

    def hyperparameters(self) -> dict[str, Scalar]:
        """The values in force: the shared keys the contract uses and the method's keys clients read."""
        training = self.settings.training.values()
        method = self.method.values()
        own = {k: method[k] for k in self.contract.broadcast_keys()}
        return {**{k: training[k] for k in self.contract.uses}, **own}

    def tuning(self) -> MethodSettings | None:
        """The tuner's settings when the values in force move every round (``tune = "fathom"``), else ``None``."""
        return self.settings.tuner

    def evaluate_config(self) -> dict[str, Scalar]:
        """What every evaluate config holds besides ``server-round``: the adaptation (``adapt-lr`` 0 means ``lr``).

        A contract that does not adapt at test (``adapts_at_test``) is sent ``adapt-steps`` 0.
        """
        training = self.settings.training
        steps = training.adapt_steps if self.contract.adapts_at_test else 0
        return {"adapt-steps": steps, "adapt-lr": training.adapt_lr or training.lr,
                "adapt-batch-size": training.adapt_batch_size}  # fmt: skip

    def sample_fit(self, server_round: int, partitions: list[int]) -> list[int]:
        """The partitions that train in ``server_round``: ``fraction-fit`` of those connected, seeded."""
        return self._sample(server_round, partitions, self.settings.run.fraction_fit, "fit")

    def sample_evaluate(self, server_round: int, partitions: list[int]) -> list[int]:
        """The partitions that evaluate in ``server_round``: ``fraction-evaluate`` of those connected, seeded."""
        return self._sample(server_round, partitions, self.settings.run.fraction_evaluate, "evaluate")

    def parameters_for(self, partition: int, purpose: str) -> list[np.ndarray]:
        """The model's arrays sent to ``partition`` in a ``purpose`` (``fit`` or ``evaluate``) instruction.

        The default is the global model's shared arrays (all of them, unless the contract
        keeps personal ones on the clients). A reply's update is measured from what this
        returns for ``fit``, so it must return the same arrays for a partition within a round.
        """
        return self.global_shared

    def begin_round(self, server_round: int, partitions: list[int], purpose: str) -> dict[str, Scalar]:
        """Called once ``purpose``'s (``fit``, ``evaluate``) ``partitions`` are chosen, before any message is built.

        A method whose :meth:`parameters_for` differs per client computes the round's
        payloads here (FedAMP's cloud models ``u_i``); they must stay as they are until the
        round's replies are combined (the update norms are measured from them). It returns
        entries for the round's record (``{}``: none).
        """
        return {}

    def payload_for(self, partition: int, purpose: str) -> dict[str, list[np.ndarray]]:
        """The array sets sent to ``partition`` beside the model: those the contract ``sends`` for ``purpose``."""
        return {}

    def payload_shapes(self, name: str) -> list[tuple[int, ...]]:
        """The shapes the returned array set ``name`` must have: by default those of the arrays that travel."""
        return self.sent_shapes

    def payload_dtypes(self, name: str) -> list[np.dtype]:
        """The dtypes the returned array set ``name`` must have: by default those of the arrays that travel."""
        return self.sent_dtypes

    def combine(self, server_round: int, replies: list[Reply]) -> tuple[list[np.ndarray] | None, dict[str, Scalar]]:
        """The new global model's shared arrays from the round's accepted replies, and extra metrics for the record.

        ``None`` keeps the global model. The default averages the models as ``aggregation``
        says: by example count, uniformly, or robustly (coordinate-wise median, trimmed
        mean, Krum, multi-Krum). Replies come in partition order; their arrays may be
        overwritten; the sets the contract ``returns`` are in ``reply.extras``.
        """
        if not replies:
            return None, {}
        return self.average([reply.arrays for reply in replies], replies, server_round=server_round,
                            center=self.global_shared), {}  # fmt: skip

    def average(self, arrays: list[list[np.ndarray]], replies: list[Reply], *, server_round: int,
                center: list[np.ndarray] | None = None) -> list[np.ndarray]:  # fmt: skip
        """The round's ``aggregation`` of ``arrays`` (one list per reply, in ``replies``' order; may be overwritten).

        A method that averages more than the models (SCAFFOLD's control variates) averages
        them through this too, so that every average it keeps is of the same kind.
        ``center`` is where ``centered-clip`` starts (the global model the replies began
        from); ``server_round`` seeds the buckets of ``bucket-size``.
        """
        run = self.settings.run
        return aggregate(arrays, self.averaging_weights(replies), rule=run.aggregation,
                         trim_fraction=run.trim_fraction, attackers=run.krum_attackers,
                         float_layers=self.float_layers, bucket_size=run.bucket_size, center=center,
                         clip_radius=run.clip_radius,
                         rng=np.random.default_rng([run.seed, server_round, 74]))  # fmt: skip

    def averaging_weights(self, replies: list[Reply]) -> list[float]:
        """Each reply's weight in the round's average (``aggregation``): its example count, or 1 for every reply.

        The robust rules weigh every reply alike except multi-Krum, which averages the
        replies it keeps by these weights.
        """
        by_examples = self.settings.run.aggregation == "examples"
        return [float(reply.num_examples) if by_examples else 1.0 for reply in replies]

    def start(self) -> None:
        """Set-up once the nodes are known, before round 1 (``self.nodes.properties`` holds their answers)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Named arrays and JSON scalars a checkpoint keeps for this method (the base has none)."""
        return {}, {}

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """The inverse of :meth:`state`."""

    def finish(self) -> None:
        """What the run writes at its end, besides the summary (through ``self.recorder``)."""

    def divergence_hint(self) -> str:
        """The likeliest cause of a diverged run, for its reason (base: the step sizes in force)."""
        return "most likely the cause: lower them"

    def step_values(self) -> dict[str, float]:
        """The run's value of each of the method's step-size keys (before a tuner moves them)."""
        values = self.settings.as_run_config()
        return {k: float(values[k]) for k in self.contract.step_keys() if k in values}

    def _sample(self, server_round: int, partitions: list[int], fraction: float, purpose: str) -> list[int]:
        minimum = self.settings.run.min_fit_clients
        size = sample_size(len(partitions), fraction, minimum)
        if len(partitions) < minimum:
            log(WARNING, "only %d node(s) connected (fewer than the %d asked for); sampling %d of them",
                len(partitions), minimum, size)  # fmt: skip
        return sample_partitions(partitions, size, seed=self.settings.run.seed, server_round=server_round,
                                 purpose=purpose)  # fmt: skip
