"""Checkpoints of a run and resuming from one: the global model, the records, the node map, the method's state."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.common.logger import log

from strategies.contracts.client_reports import PARTITION_ID
from strategies.nodes.directory import NodeDirectory
from strategies.rounds.checkpoint import (
    Checkpoint,
    CheckpointError,
    arrays_of_model,
    check_model,
    model_arrays,
    state_problem,
)
from strategies.tuning.tuner import FathomTuner

# What a method's or the tuner's restore raises on a state of the wrong shape (a missing key, a string
# where a number goes, an array too short); a checkpoint is input, so each is reported as a CheckpointError.
STATE_MISFITS = (KeyError, TypeError, ValueError, IndexError, AttributeError)
# The tuner's scalars (:meth:`strategies.tuning.tuner.FathomTuner.checkpoint_state`): the values in force are
# positive numbers, the counts whole numbers from 0; a value of the wrong kind would reach every client.
TUNER_VALUES, TUNER_COUNTS = ("lr", "epochs", "batch-size"), ("round", "decays")
TUNER_REQUIRED = ("lr", "epochs", "batch-size", "round")  # ``decays`` came later: older checkpoints lack it


@dataclass(frozen=True)
class Resumed:
    """What a run takes back from its checkpoint: its records, its clock and its global model."""

    history: list[dict]
    elapsed_seconds: float
    model: list[np.ndarray]


class RunCheckpoints:
    """Writes a run's checkpoints and resumes a run from one; every strategy holds one (``strategy.checkpoints``).

    Everything it reads comes in as an argument: the run's constants here, what changes
    over the run (the model, the records, the tuner, the method's state) with each call.

    Parameters
    ----------
    name
        The method's name: a checkpoint written by another method is refused.
    num_rounds
        The run's rounds (for the log line on resuming).
    kept_on_clients
        What the method's clients keep in ``Context.state``, in words (``""``: nothing);
        a resumed run warns that a new Flower run starts it empty.
    nodes
        The run's node directory: a checkpoint holds its node map, and resuming merges it back.

    """

    def __init__(self, *, name: str, num_rounds: int, kept_on_clients: str, nodes: NodeDirectory) -> None:
        self.name, self.num_rounds, self.kept_on_clients, self.nodes = name, num_rounds, kept_on_clients, nodes

    def checkpoint(self, server_round: int, *, model: list[np.ndarray], history: list[dict], elapsed_seconds: float,
                   own: tuple[dict[str, np.ndarray], dict], tuner: FathomTuner | None) -> Checkpoint:  # fmt: skip
        """The run after ``server_round``: its global ``model``, round records, node map, the method's ``own`` state.

        ``own`` is what the method's ``state`` hook returns (named arrays, JSON scalars); a
        tuned run's ``tuner`` adds its own. The state is copied: the run goes on changing it.
        """
        own_arrays, own_state = own
        state = {"strategy": self.name, "history": history, "elapsed-seconds": elapsed_seconds,
                 "node-properties": self.nodes.properties, "own": own_state}  # fmt: skip
        if tuner is not None:
            tuner_arrays, state["tuner"] = tuner.checkpoint_state()
            own_arrays = {**own_arrays, **tuner_arrays}
        return Checkpoint(round=server_round, arrays={**model_arrays(model), **own_arrays}, state=copy.deepcopy(state))

    def resume(self, checkpoint: Checkpoint, *, model: list[np.ndarray], tuner: FathomTuner | None,
               restore: Callable[[dict[str, np.ndarray], dict], None]) -> Resumed:  # fmt: skip
        """Continue from ``checkpoint`` (after the preflight): the records, clock and model to go on with.

        ``model`` is the run's initial model (the checkpoint's must have its shapes and
        dtypes); ``restore`` is the method's hook that takes back its own state, and a tuned
        run's ``tuner`` takes back its own. The node map is merged into the directory.

        Raises
        ------
        CheckpointError
            If the checkpoint was written by another strategy or for another model, or
            its state does not fit this run's method (one line, whatever the misfit).

        """
        if checkpoint.state.get("strategy") != self.name:
            raise CheckpointError(f"checkpoint was written by strategy {checkpoint.state.get('strategy')!r}, "
                                  f"this run is {self.name!r}")  # fmt: skip
        stored = arrays_of_model(checkpoint)
        check_model(model, stored)
        if problem := resumable_state_problem(checkpoint.state, tuned=tuner is not None):
            raise CheckpointError(f"checkpoint {problem}")
        state = checkpoint.state
        try:
            # JSON has no NaN: the checkpoint stores it as null
            history = [{k: np.nan if v is None else v for k, v in r.items()} for r in state["history"]]
            elapsed = float(state.get("elapsed-seconds", 0.0))
            # a node still connected keeps its partition; the preflight's fresh answers win where they differ
            self.nodes.properties = {**state.get("node-properties", {}), **self.nodes.properties}
            restore(checkpoint.arrays, state.get("own", {}))
            if tuner is not None:
                tuner.restore(checkpoint.arrays, state["tuner"])
        except CheckpointError:
            raise
        except STATE_MISFITS as err:
            raise CheckpointError(f"checkpoint state does not fit a {self.name} run: {type(err).__name__}: "
                                  f"{' '.join(str(err).split())}") from err  # fmt: skip
        log(INFO, "resumed after round %d of %d", checkpoint.round, self.num_rounds)
        if self.kept_on_clients:  # Context.state belongs to one Flower run
            log(WARNING, "resumed %s: its clients keep %s in Context.state, which a new run starts empty; the rounds "
                "after %d differ from an uninterrupted run's", self.name, self.kept_on_clients,
                checkpoint.round)  # fmt: skip
        return Resumed(history=history, elapsed_seconds=elapsed, model=stored)


def resumable_state_problem(state: dict, *, tuned: bool) -> str | None:
    """Why a checkpoint's state lacks what resuming reads, or ``None``.

    Besides the types of the entries (:func:`strategies.rounds.checkpoint.state_problem`, checked
    again for a checkpoint that was not loaded from a file), it asks for the round records,
    the tuner's state in a tuned run and a partition per node.
    """
    if problem := state_problem(state):
        return problem
    missing = [key for key in ("history", *(("tuner",) if tuned else ())) if key not in state]
    if missing:
        return f"state lacks {missing}"
    if tuned and (problem := tuner_state_problem(state["tuner"])):
        return problem
    for node, answer in state.get("node-properties", {}).items():
        partition = answer.get(PARTITION_ID) if isinstance(answer, dict) else None
        if not isinstance(partition, int) or isinstance(partition, bool):
            return f"state 'node-properties' gives node {node!r} no integer {PARTITION_ID!r} ({answer!r:.60})"
    return None


def tuner_state_problem(tuner: dict) -> str | None:
    """Why the tuner's scalars in a checkpoint are not what it writes (:data:`TUNER_VALUES`, :data:`TUNER_COUNTS`)."""
    if missing := [key for key in TUNER_REQUIRED if key not in tuner]:
        return f"state 'tuner' lacks {missing}"
    for key in (*TUNER_VALUES, *TUNER_COUNTS):
        if key in tuner and not _fits(tuner[key], count=key in TUNER_COUNTS):
            kind = "a whole number from 0" if key in TUNER_COUNTS else "a positive number"
            return f"state 'tuner' has {key} = {tuner[key]!r:.60}; it is {kind}"
    return None


def _fits(value: object, *, count: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value >= 0 and value == int(value) if count else value > 0
