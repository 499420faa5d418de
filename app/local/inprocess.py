"""Drive a stamen run and its clients in one process: the round engine on a grid whose nodes answer here.

:class:`InProcessRun` plays a run a round (or a phase) at a time: the method's round
engine (:class:`strategies.flower.rounds.Rounds`) sends its messages to an
:class:`app.local.message_grid.InProcessGrid`, whose nodes answer with stamen's own
handlers (``app.message_client``) from real stamen clients, each built by the ClientApp's
:func:`app.client_app.build_client` from a Flower ``Context`` as a simulated SuperNode gets
one (its partition in the node config, its ``state`` kept for the whole run). Every message
and reply goes through Flower's wire encoding, so a reply is byte for byte what a SuperNode
would send. What it leaves out is the processes and Flower's scheduling: long runs
(thousands of rounds) cost only the work, and ``bench/diffusion_theory.py`` (its Flower
check) shows they give the same iterates as ``flwr run`` for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import ConfigRecord, Context

from app.client_app import AppData, build_client
from app.config import parse_settings
from app.local.message_grid import InProcessGrid, node_context
from app.message_client import serving
from app.message_methods import MethodStrategy, message_strategy
from app.own_parts import OwnParts
from app.server_run import build_strategy
from clients.base import TorchClient
from strategies.base import FederatedStrategy
from strategies.contracts.common import RunSettings
from strategies.contracts.settings import Settings
from strategies.flower.rounds import Rounds
from strategies.rounds.recorder import Recorder


def build_clients(settings: Settings, num_clients: int) -> list[TorchClient]:
    """The run's method's client for partitions 0 to ``num_clients - 1``, each built as the ClientApp builds it."""
    run_config = settings.as_run_config()
    return [build_client(node_context(run_config, partition=partition, num_clients=num_clients))
            for partition in range(num_clients)]  # fmt: skip


class InProcessRun:
    """One run's method and ``num_clients`` clients, advanced a round at a time.

    ``clients[p]`` answers partition ``p``'s messages: a test may wrap its ``fit`` or
    ``evaluate`` to answer as a hostile node would. ``strategy`` is the method
    (:class:`strategies.base.FederatedStrategy`), ``rounds`` its round engine.

    Parameters
    ----------
    run_config
        The run config ``flwr run`` would get (``--run-config``), defaults filled in.
    num_clients
        The simulated SuperNodes (partitions 0 to ``num_clients - 1``).
    recorder
        Where the method writes its records (default: nowhere).
    node_ids
        Each partition's Flower node id (default: ``InProcessGrid``'s); the server numbers nodes by them.

    """

    def __init__(self, *, run_config: dict, num_clients: int, recorder: Recorder | None = None,
                 node_ids: list[int] | None = None) -> None:  # fmt: skip
        self.settings = parse_settings(run_config)
        self.strategy: FederatedStrategy = build_strategy(self.settings, recorder=recorder)
        self.grid = InProcessGrid(run_config=run_config, num_clients=num_clients, node_ids=node_ids,
                                  client_app=serving(self._client_of))  # fmt: skip
        # one Context per node for the whole run, as a SuperNode keeps one: a client's state lives in its .state
        self.clients = [build_client(context) for context in self.grid.contexts.values()]
        self.rounds = Rounds(method=self.strategy, overlap_rounds=False)
        self.rounds.started(self.grid)  # the preflight, as a run's first message does
        self.round = 0
        self.bytes_sent = self.bytes_received = 0  # the last fit round's arrays, over every instruction and reply

    def _client_of(self, context: Context) -> TorchClient:
        return self.clients[int(context.node_config["partition-id"])]

    @property
    def global_model(self) -> list[np.ndarray]:
        """The global model's arrays, every one, in ``state_dict`` order."""
        return self.strategy.global_model

    def step(self) -> dict:
        """One round of fit (no evaluation); the aggregated metrics."""
        self.round += 1
        messages = list(self.rounds.configure_train(self.round, self.rounds.global_arrays, ConfigRecord(), self.grid))
        replies = list(self.grid.send_and_receive(messages))
        self.rounds.aggregate_train(self.round, replies)
        record = self.strategy.phases.round_of(self.round).record
        self.bytes_sent, self.bytes_received = record.get("fit-bytes-sent", 0), record.get("fit-bytes-received", 0)
        return record

    def evaluate(self) -> dict:
        """The evaluation of the round just run, if it is an evaluation round; the aggregated metrics ({} if not)."""
        messages = list(self.rounds.configure_evaluate(self.round, self.rounds.global_arrays, ConfigRecord(),
                                                       self.grid))  # fmt: skip
        if not messages:
            return {}
        results, failures = self.rounds.read(list(self.grid.send_and_receive(messages)), messages, fit=False)
        return self.strategy.phases.take_evaluation(self.round, results, failures)

    def play_round(self) -> dict:
        """One whole round as the round engine plays it; the round's record, as ``metrics.jsonl`` holds it.

        Fit, the server's test of the global model (``central-eval``), the clients'
        evaluation when the round is an evaluation round, then the method closes the
        round (``end_round``: the record, the tuner's and the divergence watch's
        bookkeeping). A run the method stops raises
        :class:`strategies.rounds.run_watch.RunDivergedError`.
        """
        self.step()
        self.evaluate()
        self.strategy.end_round(self.round)
        return self.strategy.history[-1]

    def run(self, rounds: int, after_round: Callable[[int, FederatedStrategy], None]) -> None:
        """``rounds`` rounds, calling ``after_round(round, strategy)`` after each."""
        for _ in range(rounds):
            self.step()
            after_round(self.round, self.strategy)


def served_run(run_config: Mapping[str, object], *, num_clients: int, parts: OwnParts | None = None,
               app_data: AppData | None = None) -> tuple[MethodStrategy, InProcessGrid]:  # fmt: skip
    """The strategy a ServerApp builds for ``run_config``, and a grid of ``num_clients`` nodes answering here.

    By default stamen's own app; ``parts`` and ``app_data`` are an app's own, as its entry
    points hold them (:func:`app.server_app.build_server_app`,
    :func:`app.client_app.build_client_app`). The strategy is the one ``flwr run`` gets: its
    results folder, summary, checkpoints and stop rules are those of a Flower run; call
    ``strategy.start(grid=grid)`` to play the run as Flower's ServerApp does.
    """
    parts = parts or OwnParts(allow_app_keys=False)
    strategy = message_strategy(RunSettings.from_config(run_config).strategy)(
        run_config=run_config, model=parts.model, model_name=parts.model_name, model_card=parts.model_card,
        data_name=parts.data_name, allow_app_keys=parts.allow_app_keys)  # fmt: skip
    client_app = serving(lambda context: build_client(context, parts, app_data))
    return strategy, InProcessGrid(run_config=run_config, num_clients=num_clients, client_app=client_app)
