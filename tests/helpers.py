"""What several test modules share: small data, stand-in strategies and federations, copies of the code.

A test module imports these from here, never from another test module.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from conftest import REPO, FakeFleet, FakeNode, settings
from torch.nn import functional as F

from app.registry import METHODS
from clients.base import TorchClient
from clients.diffusion import DiffusionClient
from clients.models import build_model
from datasets import ClientData, load_client_data
from strategies.base import FederatedStrategy
from strategies.contracts.contract import Contract, MethodSettings
from strategies.contracts.diffusion import DiffusionSettings
from strategies.contracts.keys import key
from strategies.contracts.payload import from_bytes, to_bytes
from strategies.contracts.personal import LastLayers, WholeModel
from strategies.methods.diffusion import DiffusionServer
from strategies.rounds.phases import Instruction
from strategies.rounds.recorder import NullRecorder
from strategies.screening.replies import Evaluation, Received

# ------------------------------------------------------------------ a two-class MLP on blobs (FedRep, FedPer)

HEAD = ("layers.5.weight", "layers.5.bias")
BODY = ("layers.1.weight", "layers.1.bias", "layers.3.weight", "layers.3.bias")


def blobs(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return ClientData(x, y, x[:10], y[:10], num_classes=2)


def mlp_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The MLP's cross-entropy written out: 2 -> 80 -> 60 -> 2 with ELU."""
    hidden = F.elu(x @ params["layers.1.weight"].T + params["layers.1.bias"])
    hidden = F.elu(hidden @ params["layers.3.weight"].T + params["layers.3.bias"])
    return F.cross_entropy(hidden @ params["layers.5.weight"].T + params["layers.5.bias"], y)


def sgd_on(params: dict[str, torch.Tensor], names: tuple[str, ...], x, y, lr: float) -> dict[str, torch.Tensor]:
    """One full-batch step on ``names`` alone, the other parameters held."""
    leaves = {k: v.clone().requires_grad_(k in names) for k, v in params.items()}
    grads = torch.autograd.grad(mlp_loss(leaves, x, y), [leaves[k] for k in names])
    return {**params, **{k: params[k] - lr * g for k, g in zip(names, grads, strict=True)}}


# ------------------------------------------------------------------ copies of the code (provenance)

PACKAGES = ("app", "clients", "strategies", "datasets")


def copy_of_the_code(to: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO / package, to / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", to / "pyproject.toml")
    return to


def change_a_function(root: Path) -> None:
    path = root / "clients" / "training.py"
    path.write_text(path.read_text() + "\n\ndef a_changed_function() -> int:\n    return 1\n")


# ------------------------------------------------------------------ a method's rounds driven by hand

# The round engine (strategies/flower/rounds.py) reads Flower's messages into these values and calls the
# method's round phases with them; a test that makes its own replies calls the phases the same way.


def start_run(strategy: FederatedStrategy, fleet: FakeFleet) -> list[np.ndarray]:
    """The run started on ``fleet`` (the preflight, the method's start); the global model."""
    strategy.phases.start_run(fleet)
    return strategy.global_model


def configure_fit(strategy: FederatedStrategy, server_round: int, fleet: FakeFleet) -> list[Instruction]:
    return strategy.phases.fit_instructions(server_round, fleet)


def configure_evaluate(strategy: FederatedStrategy, server_round: int, fleet: FakeFleet) -> list[Instruction]:
    return strategy.phases.evaluate_instructions(server_round, fleet)


def aggregate_fit(strategy: FederatedStrategy, server_round: int, results: list[Received],
                  failures: Iterable[BaseException] = ()) -> tuple[list[np.ndarray] | None, dict]:  # fmt: skip
    """The round's replies combined, then the server's own test; the new global model (``None``: unchanged), metrics."""
    changed, metrics = strategy.phases.take_fit(server_round, results, list(failures))
    strategy.phases.central_test(server_round)
    return (strategy.global_model if changed else None), metrics


def aggregate_evaluate(strategy: FederatedStrategy, server_round: int, results: list[Evaluation],
                       failures: Iterable[BaseException] = ()) -> tuple[float | None, dict]:  # fmt: skip
    """The round's evaluation summarised into its record; the weighted loss (``None``: none accepted), metrics."""
    metrics = strategy.phases.take_evaluation(server_round, results, list(failures))
    return (metrics["loss"] if metrics.get("eval-clients") else None), metrics


def sent_arrays(instruction: Instruction) -> list[np.ndarray]:
    """The arrays an instruction carries (packed: the model, then each array set), decoded."""
    return [from_bytes(tensor) for tensor in instruction.tensors]


def received(node: FakeNode | str, arrays_sent, num_examples, metrics) -> Received:
    """A fit reply from ``node`` as the round engine reads it off a message."""
    return Received(getattr(node, "cid", node), [to_bytes(np.asarray(a)) for a in arrays_sent], num_examples,
                    dict(metrics))  # fmt: skip


def evaluation(node: FakeNode | str, loss, num_examples, metrics) -> Evaluation:
    """An evaluate reply from ``node`` as the round engine reads it off a message."""
    return Evaluation(getattr(node, "cid", node), loss, num_examples, dict(metrics))


def answers(fleet: FakeFleet, instructions: list[Instruction], *,
            evaluate: bool = False) -> tuple[list, list[BaseException]]:  # fmt: skip
    """Each instructed node's ``fit`` (or ``evaluate``) reply, and the exceptions of those that raised: failures."""
    results, failures = [], []
    for ins in instructions:
        node = fleet.nodes[ins.node]
        try:
            if evaluate:
                results.append(evaluation(node, *node.evaluate(sent_arrays(ins), dict(ins.config))))
            else:
                results.append(received(node, *node.fit(sent_arrays(ins), dict(ins.config))))
        except Exception as err:
            failures.append(err)
    return results, failures


def fleet_of(run) -> FakeFleet:
    """An ``InProcessRun``'s nodes (its grid's node ids), each answered by its real client without Flower's messages."""
    return FakeFleet(*(LocalNode(str(node), client) for node, client in zip(run.grid.contexts, run.clients,
                                                                             strict=True)))  # fmt: skip


def replied_arrays(reply: Received) -> list[np.ndarray]:
    """The arrays a fit reply carries (packed: the model, then each array set), decoded."""
    return [from_bytes(tensor) for tensor in reply.tensors]


def play_round(strategy: FederatedStrategy, server_round: int, fleet: FakeFleet) -> dict:
    """One whole round with the fleet's nodes answering: fit, the server's test, evaluation, the close; its record."""
    aggregate_fit(strategy, server_round, *answers(fleet, configure_fit(strategy, server_round, fleet)))
    evaluations = configure_evaluate(strategy, server_round, fleet)
    if evaluations:
        aggregate_evaluate(strategy, server_round, *answers(fleet, evaluations, evaluate=True))
    strategy.end_round(server_round)
    return strategy.history[-1]


def check_method_record(record: dict, contract: Contract) -> None:
    """What every round record of a method holds: its broadcast values, its declared metrics as declared, bytes.

    The tests that run every method (in-process and through ``flwr run``) check each record with this.
    """
    assert {f"hp-{k}" for k in contract.broadcast_keys()} <= set(record), "a broadcast value is not recorded"
    assert record["train-loss"] >= 0
    for metric in contract.metrics:  # every metric the method declares reaches the records, as declared
        for statistic, recorded in metric.record_keys().items():
            assert recorded in record, f"{contract.name} declares {metric.name!r}: {statistic} {recorded!r} missing"
            assert isinstance(record[recorded], float) or statistic == "sum", (recorded, record[recorded])
    assert record["fit-bytes-sent"] > 0 and record["fit-bytes-received"] > 0
    # an evaluate message carries the model, unless no model travels (FedProto) and nothing else is sent
    evaluate_carries = not isinstance(contract.personal, WholeModel) or contract.sent_sets("evaluate")
    assert (record["eval-bytes-sent"] > 0) == bool(evaluate_carries)


# ------------------------------------------------------------------ FedAvg on stand-in replies

SHAPES = [(2, 3), (3,)]


def arrays(value):
    return [np.full(s, value, dtype=np.float32) for s in SHAPES]


def fit_res(node, params, n, **metrics):
    """``node``'s fit reply of ``params`` on ``n`` examples, with the metrics every stamen client reports."""
    return received(node, params, n, {"train-loss": 0.5, "grad-evals": 4, **metrics})


def stand_in_fedavg(num_rounds=3, eval_every=2, clients=4, **config):
    """FedAvg on a two-array model and ``clients`` fake nodes, started: (strategy, fleet, nodes, recorder)."""
    recorder = NullRecorder()
    config = {"preflight": False, "aggregation": "examples", **config}
    run = settings(strategy="fedavg", num_server_rounds=num_rounds, eval_every=eval_every, lr=0.1, fraction_fit=1.0,
                   min_fit_clients=1, min_available_clients=1, **config)  # fmt: skip
    strategy = FederatedStrategy(settings=run, initial_model=arrays(0.0), recorder=recorder)
    nodes = [FakeNode(str(i)) for i in range(clients)]
    fleet = FakeFleet(*nodes)
    start_run(strategy, fleet)
    return strategy, fleet, nodes, recorder


# ------------------------------------------------------------------ DiffusionServer on least squares, K real clients

K = 4
DIFFUSION_KEYS = {spec.field for spec in DiffusionSettings.key_specs()}


class LocalNode(FakeNode):
    """A node whose messages are answered in this process by a real client."""

    def __init__(self, cid: str, client, *, broken: str = "") -> None:
        super().__init__(cid, partition=client.partition_id)
        self.client, self.broken = client, broken

    def get_properties(self, config):
        return self.client.get_properties(config)

    def fit(self, parameters, config):
        if self.broken == "raise":
            raise RuntimeError("client crashed")
        arrays, num, metrics = self.client.fit(parameters, config)
        if self.broken == "nan":
            arrays = [np.full_like(a, np.nan) for a in arrays]
        return arrays, num, metrics

    def evaluate(self, parameters, config):
        return self.client.evaluate(parameters, config)


def settings_for(rounds=3, **overrides):
    """Least squares on K agents; diffusion's own keys may be given without their prefix (``mode="fedsgd"``)."""
    config = {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
              "synthetic_alpha": 1.0, "synthetic_beta": 0.5, "batch_size": 200, "local_steps": 1, "mu": 0.1,
              "mode": "fedsgd", "num_server_rounds": rounds, "eval_every": 1, "min_available_clients": K,
              **overrides}  # fmt: skip
    return settings(**{f"diffusion_{k}" if k in DIFFUSION_KEYS else k: v for k, v in config.items()})


def federation(settings, *, broken: dict[int, str] | None = None, own_data: bool = False):
    """K real clients behind in-process nodes, in a fleet (node i = agent K-1-i); the fleet and the agents' data.

    ``own_data``: the clients are devices with their own data (``data-dir``), no partition number.
    """
    fleet = FakeFleet()
    data = []
    for node in range(K):
        agent = K - 1 - node  # node ids and agents deliberately differ
        part = load_client_data(settings.data_spec(K), settings.partition_spec(K), agent)
        model = build_model("linear", input_shape=(10,), num_classes=0, seed=settings.run.seed)
        place = {"partition_id": -1, "num_partitions": 0, "data_dir": f"/device-{agent}"} if own_data else {
            "partition_id": agent, "num_partitions": K}  # fmt: skip
        client = DiffusionClient(model=model, data=part, settings=settings, **place)
        # devices without a number are numbered by node id (never by a string they send): node id = agent there
        fleet.register(LocalNode(f"node-{agent if own_data else node}", client, broken=(broken or {}).get(agent, "")))
        data.append((agent, part))
    data.sort(key=lambda item: item[0])
    return fleet, [d for _, d in data]


def diffusion_strategy(settings):
    model = build_model("linear", input_shape=(10,), num_classes=0, seed=settings.run.seed)
    initial = [v.detach().numpy() for v in model.state_dict().values()]
    recorder = NullRecorder()
    strategy = DiffusionServer(settings=settings, initial_model=initial, recorder=recorder)
    return strategy, initial[0].ravel().astype(np.float64), recorder


# ------------------------------------------------------------------ a toy method that keeps the MLP's head home

MLP_NAMES = ["layers.1.weight", "layers.1.bias", "layers.3.weight", "layers.3.bias", "layers.5.weight", "layers.5.bias"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyPersonalSettings(MethodSettings):
    prefix: ClassVar[str] = "toyp"

    personal_layers: int = key(1, "the model's last layers kept on the client", at_least=1)


TOYP = Contract(name="toyp", summary="keeps the head at home", settings=ToyPersonalSettings,
                uses=("lr", "local-steps", "batch-size"), personal=LastLayers("toyp-personal-layers"))  # fmt: skip


class ToyPersonal(FederatedStrategy):
    contract = TOYP


class ToyPersonalClient(TorchClient):
    contract = TOYP

    def local_train(self, training, method, rng):
        return self.local_sgd(training, rng)


def toy_settings(**config):
    base = settings(strategy="fedavg", model="mlp", lr=0.5, local_steps=3, batch_size=8, fraction_fit=1.0,
                    min_fit_clients=1, min_available_clients=1, preflight=False, device="cpu",
                    adapt_steps=0)  # fmt: skip
    return dataclasses.replace(base, method=ToyPersonalSettings(**config))


def mlp():
    return build_model("mlp", input_shape=(2,), num_classes=2, seed=0)


def toy_client(state=None, partition=0):
    rng = np.random.default_rng(partition)
    x = rng.normal(size=(40, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    data = ClientData(x, y, x[:10], y[:10], num_classes=2)
    client = ToyPersonalClient(model=mlp(), data=data, settings=toy_settings(), partition_id=partition)
    if state is not None:
        client.state = state
    return client


def summaries_written(results: Path, names: Iterable[str]) -> Callable[[], bool]:
    """Whether every named run in ``results`` has written its ``summary.json``, the end of its ServerApp.

    A cheap sign for ``LocalDeployment.wait_all(ready=...)``: ``flwr ls`` (about 2 CPU-s a
    call here) then confirms, instead of polling every few seconds while the runs need the CPU.
    """
    names = list(names)
    return lambda: all((results / name / "summary.json").exists() for name in names)


def example_copy(name: str, to: Path, *, public_name: str) -> Path:
    """``examples/<name>`` copied into ``to`` (outside the clone), after checking what it imports is installed.

    The example imports the installed ``stamen`` (``public_name`` must be in it) and
    flwr-datasets, as an outside app would.
    """
    import importlib.util

    assert importlib.util.find_spec("flwr_datasets"), "flwr-datasets is in the test extras: pip install '.[test]'"
    installed = importlib.util.find_spec("stamen")
    assert installed and public_name in Path(installed.origin).read_text(), (
        "the example imports the installed stamen: pip install . (again, after changing the clone)")
    copy = to / name
    shutil.copytree(REPO / "examples" / name, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


# ---------------------------------------------------------------- runs on the Message API, in this process

CLIENTS = 4
QUICK = {"num-server-rounds": 3, "fraction-fit": 0.5, "min-available-clients": CLIENTS, "local-steps": 2,
         "batch-size": 4, "adapt-batch-size": 4, "perfedavg-outer-batch-size": 4, "perfedavg-hessian-batch-size": 4,
         "eval-every": 2}  # fmt: skip
GENERATED = ("least-squares", "synthetic")  # data with no test set for the server's own test (central-eval)
OWN = {"fathom": {"local-epochs": 0.1, "fathom-batch-min": 2.0, "batch-size": 4}}


def config_of(name: str, results: Path, run_name: str, **extra) -> dict:
    """``name``'s example run config, shortened to a few quick rounds on ``CLIENTS`` nodes."""
    from app.registry import METHODS

    contract = METHODS[name].contract  # the server tests a model only where it holds the whole of it and a test set
    central = contract.personal is None and contract.example.get("dataset") not in GENERATED
    return {**contract.example, **QUICK, **OWN.get(name, {}), "central-eval": central,
            "results-dir": str(results), "run-name": run_name, **extra}  # fmt: skip


def records(results: Path, run_name: str) -> list[dict]:
    """``metrics.jsonl`` without what the clock decides (seconds, Unix times)."""
    rows = [json.loads(line) for line in (results / run_name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if "seconds" not in k and not k.endswith("-unix")} for row in rows]


def message_run(config: dict, *, grid=None, strategy_class=None) -> object:
    """``config``'s run on the Message API adapter, its nodes answering in this process (or on ``grid``)."""
    from app.local.message_grid import InProcessGrid
    from app.message_methods import message_strategy

    strategy = (strategy_class or message_strategy(config["strategy"]))(run_config=config)
    strategy.start(grid=grid or InProcessGrid(run_config=config, num_clients=CLIENTS))
    return strategy


# ------------------------------------------------------------------ a finished run's folder, as a run leaves it

FINISHED_CLIENTS = 4
FINISHED_ROUNDS = 2
# FATHOM: its tuner adds state of its own to every checkpoint, so a fuzz of it has more to break
FINISHED_CONFIG = {**METHODS["fathom"].contract.example, "num-server-rounds": FINISHED_ROUNDS, "checkpoint-every": 1}


def finished_run(results_dir: Path, name: str) -> Path:
    """``<results_dir>/<name>``, as a finished two-round FATHOM run with checkpoints leaves it."""
    from app.config import parse_settings
    from app.local.inprocess import InProcessRun
    from app.results.writer import ResultWriter

    config = {**FINISHED_CONFIG, "results-dir": str(results_dir), "run-name": name}
    run_dir = results_dir / name
    writer = ResultWriter(run_dir=run_dir, settings=parse_settings(config).as_run_config())
    run = InProcessRun(run_config=config, num_clients=FINISHED_CLIENTS, recorder=writer)
    for _ in range(FINISHED_ROUNDS):
        run.step()
        run.evaluate()
        run.strategy.end_round(run.round)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    return run_dir


# ------------------------------------------------------------------ the Fleet gate, in this process


def can_bind(host: str) -> bool:
    """Whether ``host`` is an address of this machine (Linux has all of 127.0.0.0/8)."""
    import socket

    try:
        with socket.socket() as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


def through_gate(ca_cert: Path, method: str, path: str, **kwargs) -> tuple:
    """One request to a FleetGate whose SuperLink is a stand-in that records what reaches it: response, requests."""
    import asyncio

    import httpx

    from app.local.fleet_gate import FleetGate

    reached: list[httpx.Request] = []

    def superlink(request: httpx.Request) -> httpx.Response:
        reached.append(request)
        # a stream, as a real connection gives it: the gate relays it chunk by chunk
        reply = httpx.ByteStream(b"reply:" + request.content)
        return httpx.Response(200, stream=reply, headers={"x-from": "superlink"})

    async def send() -> httpx.Response:
        gate = FleetGate(upstream="127.0.0.1:1", ca_cert=ca_cert, transport=httpx.MockTransport(superlink))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="https://gate") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send()), reached
