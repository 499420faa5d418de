"""Checkpoints of a run and resuming from one: the global model, the records, the node map, the method's state."""

from __future__ import annotations

import copy
import time
from logging import INFO, WARNING

import numpy as np
from flwr.common import Parameters
from flwr.common.logger import log

from strategies.checkpoint import Checkpoint, CheckpointError, arrays_of_model, check_shapes, model_arrays


class RunCheckpoints:
    """A part of :class:`strategies.base.FederatedStrategy` (see the module's docstring)."""

    def checkpoint(self, server_round: int) -> Checkpoint:
        """The run after ``server_round``: global model, round records, node map and the method's :meth:`state`."""
        own_arrays, own_state = self.state()
        state = {"strategy": self.name, "history": self.history, "elapsed-seconds": time.perf_counter() - self.started,
                 "node-properties": self.nodes.properties, "own": own_state}  # fmt: skip
        if self.tuner is not None:
            tuner_arrays, state["tuner"] = self.tuner.checkpoint_state()
            own_arrays = {**own_arrays, **tuner_arrays}
        # a copy: the run goes on changing its history and state after this call
        return Checkpoint(round=server_round, arrays={**model_arrays(self.global_model), **own_arrays},
                          state=copy.deepcopy(state))  # fmt: skip

    def resume(self, checkpoint: Checkpoint) -> Parameters:
        """Continue from ``checkpoint`` (after the preflight); returns the global model to start from.

        Raises
        ------
        CheckpointError
            If the checkpoint was written by another strategy or for another model.

        """
        if checkpoint.state.get("strategy") != self.name:
            raise CheckpointError(f"checkpoint was written by strategy {checkpoint.state.get('strategy')!r}, "
                                  f"this run is {self.name!r}")  # fmt: skip
        stored = arrays_of_model(checkpoint)
        check_shapes(self.shapes, stored)
        # JSON has no NaN: the checkpoint stores it as null
        self.history = [{k: np.nan if v is None else v for k, v in r.items()} for r in checkpoint.state["history"]]
        self.started = time.perf_counter() - float(checkpoint.state.get("elapsed-seconds", 0.0))
        # a node still connected keeps its partition; the preflight's fresh answers win where they differ
        self.nodes.properties = {**checkpoint.state.get("node-properties", {}), **self.nodes.properties}
        self.restore(checkpoint.arrays, checkpoint.state.get("own", {}))
        if self.tuner is not None:
            self.tuner.restore(checkpoint.arrays, checkpoint.state["tuner"])
        self._use_model(stored)
        log(INFO, "resumed after round %d of %d", checkpoint.round, self.num_rounds)
        if kept := self.contract.client_state(self.method):  # Context.state belongs to one Flower run
            log(WARNING, "resumed %s: its clients keep %s in Context.state, which a new run starts empty; the rounds "
                "after %d differ from an uninterrupted run's", self.name, kept, checkpoint.round)  # fmt: skip
        return self.global_parameters
