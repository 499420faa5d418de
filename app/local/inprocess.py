"""Drive a stamen strategy and its clients in one process, through Flower's Strategy API.

Flower's server does, each round, ``configure_fit`` -> each chosen proxy's ``fit`` ->
``aggregate_fit``; this does the same with proxies that answer in this process from
real stamen clients, each built by the ClientApp's own :func:`app.client_app.build_client`
from a Flower ``Context`` as a simulated SuperNode gets one (its partition in the node
config, its ``state`` kept for the whole run).
Messages keep Flower's encoding (``ndarrays_to_parameters``), so a reply is
byte-for-byte what a SuperNode would send. What it leaves out is the transport, the
processes and Flower's scheduling: long runs (thousands of rounds) cost only the
work, and ``bench/diffusion_theory.py`` (its Flower check) shows they give the same
iterates as ``flwr run`` for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flwr.common import (
    Code,
    Context,
    EvaluateRes,
    FitRes,
    GetPropertiesRes,
    Parameters,
    RecordDict,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from app.client_app import AppData, build_client
from app.config import parse_settings
from app.own_parts import OwnParts
from app.server_app import server_fn, server_function
from app.server_run import build_strategy
from clients.base import TorchClient
from strategies.base import FederatedStrategy
from strategies.contracts.settings import Settings
from strategies.recorder import Recorder
from strategies.server import RoundServer

OK = Status(code=Code.OK, message="")


def node_context(run_config: Mapping[str, object], *, partition: int, num_clients: int) -> Context:
    """The ``Context`` Flower's simulation gives the SuperNode of ``partition``: its node config and a fresh state."""
    node_config = {"partition-id": partition, "num-partitions": num_clients}
    return Context(run_id=0, node_id=partition, node_config=node_config, state=RecordDict(),
                   run_config=dict(run_config))  # fmt: skip


def build_clients(settings: Settings, num_clients: int) -> list[TorchClient]:
    """The run's method's client for partitions 0 to ``num_clients - 1``, each built as the ClientApp builds it."""
    run_config = settings.as_run_config()
    return [build_client(node_context(run_config, partition=partition, num_clients=num_clients))
            for partition in range(num_clients)]  # fmt: skip


class InProcessProxy(ClientProxy):
    """A node answered by a stamen client in this process."""

    def __init__(self, cid: str, client) -> None:
        super().__init__(cid)
        self.client = client

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(OK, self.client.get_properties(ins.config))

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError("stamen's server never asks a client for its parameters")

    def fit(self, ins, timeout, group_id):
        arrays, num, metrics = self.client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
        return FitRes(OK, ndarrays_to_parameters(arrays), num, metrics)

    def evaluate(self, ins, timeout, group_id):
        loss, num, metrics = self.client.evaluate(parameters_to_ndarrays(ins.parameters), ins.config)
        return EvaluateRes(OK, loss, num, metrics)

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class InProcessRun:
    """One run's strategy and ``num_clients`` clients, advanced a round at a time.

    Parameters
    ----------
    run_config
        The run config ``flwr run`` would get (``--run-config``), defaults filled in.
    num_clients
        The simulated SuperNodes (partitions 0 to ``num_clients - 1``).
    recorder
        Where the strategy writes its records (default: nowhere).

    """

    def __init__(self, *, run_config: dict, num_clients: int, recorder: Recorder | None = None) -> None:
        self.settings = parse_settings(run_config)
        self.strategy: FederatedStrategy = build_strategy(self.settings, recorder=recorder)
        self.manager = SimpleClientManager()
        # one Context per node for the whole run, as a SuperNode keeps one: a client's state lives in its .state
        self.contexts = [node_context(run_config, partition=partition, num_clients=num_clients)
                         for partition in range(num_clients)]  # fmt: skip
        self.clients = [build_client(context) for context in self.contexts]
        for partition, client in enumerate(self.clients):
            self.manager.register(InProcessProxy(f"node-{partition}", client))
        self.parameters: Parameters = self.strategy.initialize_parameters(self.manager)
        self.round = 0
        self.bytes_sent = self.bytes_received = 0  # the last fit round's arrays, over every instruction and reply

    def step(self) -> dict:
        """One round of fit (no evaluation); the aggregated metrics."""
        self.round += 1
        instructions = self.strategy.configure_fit(self.round, self.parameters, self.manager)
        results = [(proxy, proxy.fit(ins, None, None)) for proxy, ins in instructions]
        self.bytes_sent = sum(len(t) for _, ins in instructions for t in ins.parameters.tensors)
        self.bytes_received = sum(len(t) for _, res in results for t in res.parameters.tensors)
        parameters, metrics = self.strategy.aggregate_fit(self.round, results, [])
        if parameters is not None:
            self.parameters = parameters
        return metrics

    def evaluate(self) -> dict:
        """The evaluation of the round just run, if it is an evaluation round; the aggregated metrics ({} if not)."""
        instructions = self.strategy.configure_evaluate(self.round, self.parameters, self.manager)
        results = [(proxy, proxy.evaluate(ins, None, None)) for proxy, ins in instructions]
        return self.strategy.aggregate_evaluate(self.round, results, [])[1] if results else {}

    def play_round(self) -> dict:
        """One whole round as Flower's server plays it; the round's record, as ``metrics.jsonl`` holds it.

        Fit, the server's test of the global model (``central-eval``), the clients'
        evaluation when the round is an evaluation round, then the strategy closes the
        round (``end_round``: the record, the tuner's and the divergence watch's
        bookkeeping). A run the strategy stops raises
        :class:`strategies.run_watch.RunDivergedError`.
        """
        self.step()
        self.strategy.evaluate(self.round, self.parameters)
        self.evaluate()
        self.strategy.end_round(self.round)
        return self.strategy.history[-1]

    def run(self, rounds: int, after_round: Callable[[int, FederatedStrategy], None]) -> None:
        """``rounds`` rounds, calling ``after_round(round, strategy)`` after each."""
        for _ in range(rounds):
            self.step()
            after_round(self.round, self.strategy)


def served_run(run_config: dict, *, num_clients: int, parts: OwnParts | None = None,
               app_data: AppData | None = None) -> tuple[RoundServer, int]:  # fmt: skip
    """The server a ServerApp builds for ``run_config``, and its rounds; its nodes answer in this process.

    By default stamen's own app (``app.server_app.server_fn``); ``parts`` and ``app_data``
    are an app's own, as its entry points hold them (:func:`app.server_app.build_server_app`,
    :func:`app.client_app.build_client_app`). The server is the one ``flwr run`` gets: its
    results folder, summary, checkpoints and stop rules are those of a Flower run; call
    ``server.fit(rounds, None)`` to play the run as Flower's ServerApp does.
    """
    build_server = server_fn if parts is None else server_function(parts)
    components = build_server(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                      run_config=dict(run_config)))  # fmt: skip
    manager = components.server.client_manager()
    for partition in range(num_clients):
        context = node_context(run_config, partition=partition, num_clients=num_clients)
        manager.register(InProcessProxy(f"node-{partition}", build_client(context, parts, app_data)))
    return components.server, components.config.num_rounds
