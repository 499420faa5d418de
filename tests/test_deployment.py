"""Real deployments on 127.0.0.1: a SuperLink, SuperNodes, ``flwr run`` against them, status from ``flwr ls``.

On a cold SuperNode every message starts a fresh ``flwr-clientapp`` process, which
costs about 5 CPU-seconds here (importing flwr and torch), and each side polls
every 3 s. Two deployments run side by side, each in a worker thread that the
module fixture starts at once:

- ``secure``: TLS and SuperNode authentication, 2 enrolled SuperNodes and one
  whose key nobody registered; the transport methods (tests/selection.py), 2 rounds each with one
  node training a round, submitted together. Its SuperNodes are warm devices
  (``python -m app.device.console``, docs/deployment.md): each message forks a process
  that has torch imported already, which took this scenario from 428 s to 222 s
  on 2 cores (the latter beside two other jobs); ``tests/test_warm_device.py`` shows
  that a warm device gives the cold path's results.
- ``lossy``: insecure, cold SuperNodes (Flower's own ``flower-superexec``), 3
  SuperNodes, fedavg for 3 rounds; one SuperNode is SIGKILLed once round 1 is
  recorded.

Clients are not asked to evaluate (``fraction-evaluate = 0``, a ClientApp process
per node saved); the server tests the global model after every round instead
(``central-eval``). Client-side evaluation runs through Flower in the simulation tests.

Each deployment stops every process it started (by process group) when its
scenario ends, whether it passed or failed.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO
from helpers import summaries_written
from selection import TRANSPORT_METHODS, selected_runs

from app.config import ConfigError, parse_settings
from app.local.deployment import CONNECTION, LocalDeployment, live_processes
from app.local.simulation import FINISHED_OK
from app.registry import METHODS
from strategies.contracts.common import TrainingSettings

pytestmark = pytest.mark.e2e
RUN_TIMEOUT_S = 280
STRATEGIES = TRANSPORT_METHODS  # one per kind of message and state (tests/selection.py)
TRAINING_KEYS = {spec.name for spec in TrainingSettings.key_specs()}


def own_settings(strategy: str) -> dict:
    """The method's example without its data (the deployment runs on the embedded data); its model if it fits them."""
    example = METHODS[strategy].contract.example
    keep = TRAINING_KEYS if example.get("dataset", "mnist-5k") == "mnist-5k" else TRAINING_KEYS - {"model"}
    return {k: v for k, v in example.items() if k in keep or k.startswith(f"{strategy}-")}


def two_round_config(strategy: str, results: Path) -> dict:
    # the server tests the global model; clients are not asked to (one ClientApp process per node saved)
    config = {"strategy": strategy, "num-server-rounds": 2, "fraction-evaluate": 0.0, "central-eval": True,
              "results-dir": str(results), "run-name": strategy, **own_settings(strategy)}  # fmt: skip
    if not accepts(config, {}):  # no whole model on the server (personal layers): the clients test theirs, once
        config.update({"central-eval": False, "fraction-evaluate": 1.0, "eval-every": 2})
    if accepts(config, {"preflight": False}):  # skip the preflight's ClientApp process per node, unless the method
        config["preflight"] = False  # needs it (diffusion's node map)
    one_trainer = {"fraction-fit": 0.5, "min-fit-clients": 1}  # a ClientApp process per round saved; both nodes
    if accepts(config, one_trainer):  # still answer the properties query, and FedRep's and FedPer's evaluation
        config.update(one_trainer)
    return config


def accepts(config: dict, change: dict) -> bool:
    try:
        parse_settings({**config, **change})
    except ConfigError:
        return False
    return True


def secure_scenario(workdir: Path, strategies: tuple[str, ...]) -> dict:
    results = workdir / "results"
    with LocalDeployment(app_dir=REPO, num_nodes=2, tls=True, node_auth=True, warm=True,
                         workdir=workdir / "deployment") as deployment:  # fmt: skip
        intruder = deployment.start_node(1, register=False, name="intruder")
        # every method's run submitted at once: a run spends most of its time waiting on the 3 s polls, which the
        # others fill (one after another, each method added about 50 s)
        run_ids = {s: deployment.submit(two_round_config(s, results)) for s in strategies}
        statuses = deployment.wait_all(list(run_ids.values()), timeout_s=RUN_TIMEOUT_S * 2, poll_s=30,
                                       ready=summaries_written(results, strategies))  # fmt: skip
        nodes = deployment.flwr(["supernode", "ls", CONNECTION])["nodes"]
        intruder_exit = intruder.process.wait(timeout=60)
        ca = deployment.certificates.ca_cert.read_text()
        logs = {s: _log(deployment, run_id) for s, run_id in run_ids.items() if statuses[run_id] != FINISHED_OK}
    return {"statuses": {s: statuses[run_id] for s, run_id in run_ids.items()}, "logs": logs, "results": results,
            "nodes": nodes, "intruder-exit": intruder_exit, "ca": ca, "groups": deployment.process_groups(),
            "intruder-log": intruder.log_path.read_text(errors="replace")}  # fmt: skip


def _log(deployment: LocalDeployment, run_id: str) -> str:
    log = subprocess.run(["flwr", "log", run_id, CONNECTION, "--show"], env=deployment.env, cwd=deployment.workdir,
                         capture_output=True, text=True, timeout=60).stdout[-3000:]  # fmt: skip
    return log + "\n" + deployment.report()


def wait_for_round_one(deployment: LocalDeployment, run_id: str, metrics: Path, deadline: float) -> None:
    """Return as soon as round 1 is recorded in ``metrics`` (or the run has finished, or at ``deadline``).

    The run's status (``flwr ls``, a process that takes seconds under load) is asked beside
    the file's watch, never in its way: a kill that came one status call late came after
    node 2 had answered round 2 too (round 2: 3 successes, round 3: the failure; CI, 3 of 4
    full runs, reproduced by delaying the status call 20 s).
    """
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        status: Future | None = None
        asked = time.monotonic()
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
            if status is not None and status.done():
                if status.result().startswith("finished"):  # a run that failed early records nothing
                    return
                status = None
            if status is None and time.monotonic() - asked > 15:
                status, asked = pool.submit(deployment.status, run_id), time.monotonic()
            time.sleep(0.1)
    finally:
        pool.shutdown(wait=False)  # not `with`: its exit would wait for a status call under way


def lossy_scenario(workdir: Path) -> dict:
    results = workdir / "results"
    config = {"strategy": "fedavg", "partitioner": "iid", "num-server-rounds": 3, "fraction-fit": 1.0,
              "fraction-evaluate": 0.0, "central-eval": True, "preflight": False, "min-fit-clients": 2,
              "min-available-clients": 3, "results-dir": str(results), "run-name": "lossy"}  # fmt: skip
    with LocalDeployment(app_dir=REPO, num_nodes=3, workdir=workdir / "deployment") as deployment:
        run_id = deployment.submit(config)
        wait_for_round_one(deployment, run_id, results / "lossy" / "metrics.jsonl", time.monotonic() + RUN_TIMEOUT_S)
        deployment.kill_node(2)  # as a device losing power after round 1
        status = deployment.wait_all([run_id], timeout_s=RUN_TIMEOUT_S, poll_s=30,
                                     ready=summaries_written(results, ["lossy"]))[run_id]  # fmt: skip
        log = _log(deployment, run_id) if status != FINISHED_OK else ""
    return {"status": status, "log": log, "results": results / "lossy", "groups": deployment.process_groups()}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory, request) -> dict[str, Future]:
    pool = ThreadPoolExecutor(max_workers=2)
    # the methods whose TLS test is selected (``-k fedbn``: FedBN's alone); the other secure-scenario tests need one
    strategies = tuple(s for s in STRATEGIES if s in selected_runs(request, "strategy", {})) or ("fedavg",)
    futures = {
        "lossy": pool.submit(lossy_scenario, tmp_path_factory.mktemp("lossy")),
        "secure": pool.submit(secure_scenario, tmp_path_factory.mktemp("secure"), strategies),
    }
    yield futures
    pool.shutdown(wait=True)  # each scenario stops its own processes, also when it failed


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tls_deployment_with_two_supernodes_runs_the_strategy_to_completion(scenarios, strategy):
    result = scenarios["secure"].result()
    assert result["statuses"][strategy] == FINISHED_OK, result["logs"].get(strategy)
    run_dir = result["results"] / strategy
    rounds = records(run_dir)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["clients-succeeded"] == r["clients-sampled"] >= 1 and r["clients-failed"] == 0 for r in rounds)
    if "central-loss" in rounds[0]:
        assert all(math.isfinite(r["central-loss"]) and 0 <= r["central-accuracy"] <= 1 for r in rounds)
    else:  # a method that keeps personal layers: its clients tested their own models in the last round
        assert rounds[-1]["eval-clients"] == 2 and 0 <= rounds[-1]["accuracy"] <= 1
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    assert (run_dir / "accuracy.png").stat().st_size > 0
    assert "BEGIN CERTIFICATE" in result["ca"]


def test_supernode_with_an_unregistered_key_is_refused(scenarios):
    result = scenarios["secure"].result()
    assert result["intruder-exit"] != 0
    assert "Failed to activate SuperNode" in result["intruder-log"]
    assert len(result["nodes"]) == 2  # only the enrolled ones ever joined


def test_killed_supernode_is_recorded_as_failed_and_the_run_completes_and_improves(scenarios):
    result = scenarios["lossy"].result()
    assert result["status"] == FINISHED_OK, result["log"]
    rounds = records(result["results"])
    seen = [{k: r.get(k) for k in ("round", "clients-sampled", "clients-succeeded", "clients-failed", "fit-failures")}
            for r in rounds]  # fmt: skip
    assert [r["round"] for r in rounds] == [1, 2, 3], seen
    assert rounds[0]["clients-succeeded"] == 3 and rounds[0]["clients-failed"] == 0, seen
    lost = [r for r in rounds[1:] if r["clients-failed"] > 0]
    assert lost, f"the killed node's round was not recorded as a failure: {seen}"
    assert all(len(r["fit-failures"]) == r["clients-failed"] for r in lost)
    # killed before its reply, Flower says the node is unavailable; killed while pushing the reply, that the reply's
    # objects never arrived (seen under load): either way the failure names the lost node's message
    assert any(reason in lost[0]["fit-failures"][0] for reason in ("Node Unavailable", "Reply message objects are "
                                                                   "unavailable"))  # fmt: skip
    assert all(r["clients-succeeded"] == 2 for r in rounds[1:]), seen  # the two survivors carried every later round
    assert rounds[-1]["clients-sampled"] == 2, seen  # sampling shrank to the nodes still connected
    # the server tests the global model after every round: it kept improving without the lost node
    losses = [r["central-loss"] for r in rounds]
    assert losses[2] < losses[1] < losses[0], losses


def test_every_process_is_stopped(scenarios):
    # SuperLink, SuperNodes and whatever they started (ServerApp, SuperExec, ClientApp) share a process group each
    for name, future in scenarios.items():
        left = live_processes(future.result()["groups"])
        assert left == [], f"{name}: processes {left} are still running"
