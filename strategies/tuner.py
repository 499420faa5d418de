"""FATHOM's online tuner as a part any method's strategy can hold (``tune = "fathom"``).

FATHOM's signals do not depend on FedAvg: ``H`` compares consecutive global updates,
which every method whose server makes a new global model has, and ``phi`` measures how
aligned a client's successive local steps are, which every method that takes local
gradient steps has (its clients report it when the run is tuned). A method's contract
says which of its keys are its step size, its local work and its batch size
(:class:`strategies.contracts.contract.Tunable`); the tuner moves those values with
:func:`strategies.fathom_math.fathom_update` and the strategy broadcasts them in every
fit config, where the clients read them under the same keys.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Scalar

from strategies.aggregation import flatten
from strategies.contracts.contract import Metric
from strategies.contracts.fathom import CONTRACT as FATHOM
from strategies.contracts.fathom import PHI, FathomSettings
from strategies.fathom_math import FathomState, RoundAggregate, fathom_update
from strategies.screening import Reply

PHI_METRIC: Metric = next(m for m in FATHOM.metrics if m.name == PHI)  # required in a tuned run's fit replies


class FathomTuner:
    """The values in force for one run's step size, local work and batch size, and their update.

    Parameters
    ----------
    settings
        FATHOM's hyper-steps, smoothing and bounds (the ``fathom-*`` keys).
    keys
        Dimension (``step``, ``work``, ``batch``) -> the run-config key it moves.
    start
        Every key's starting value (the run's settings).

    """

    def __init__(self, *, settings: FathomSettings, keys: dict[str, str], start: dict[str, object]) -> None:
        self.settings = settings
        self.keys = keys
        self.work_bounds = settings.bounds_of("work", keys["work"])[1]
        self.state = FathomState(lr=float(start[keys["step"]]), epochs=float(start[keys["work"]]),
                                 batch_size=float(start[keys["batch"]]))  # fmt: skip

    def values(self) -> dict[str, Scalar]:
        """The values in force, by run-config key, for the next fit config (reals; clients round int keys)."""
        state = self.state
        return {self.keys["step"]: state.lr, self.keys["work"]: state.epochs, self.keys["batch"]: state.batch_size}

    def update(self, previous: list[np.ndarray], combined: list[np.ndarray], replies: list[Reply]) -> dict[str, float]:
        """Move the values after a round from the global update and the replies' ``phi``; the round's signals."""
        aggregate = RoundAggregate(
            update=flatten(combined, np.float64) - flatten(previous, np.float64),
            examples=np.array([reply.num_examples for reply in replies], dtype=np.float64),
            phis=np.array([float(reply.metrics[PHI]) for reply in replies]),
        )
        self.state, hg = fathom_update(self.state, aggregate, self.settings, work_bounds=self.work_bounds)
        return {"H": hg.global_term, "G": hg.local_term, "phi-mean": float(np.mean(aggregate.phis))}

    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Arrays and scalars a checkpoint keeps: the values in force, the update count, the smoothed update."""
        state = self.state
        scalars = {"lr": state.lr, "epochs": state.epochs, "batch-size": state.batch_size, "round": state.round}
        smoothed = state.smoothed_update
        return ({"fathom/smoothed-update": smoothed} if smoothed is not None else {}), scalars

    def restore(self, arrays: dict[str, np.ndarray], state: dict) -> None:
        """The inverse of :meth:`checkpoint_state`."""
        self.state = FathomState(
            lr=float(state["lr"]), epochs=float(state["epochs"]), batch_size=float(state["batch-size"]),
            smoothed_update=arrays.get("fathom/smoothed-update"), round=int(state["round"]),
        )  # fmt: skip
