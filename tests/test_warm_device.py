"""Warm devices (``python -m app.device.console``) in a real deployment: TLS, SuperNode authentication, own data.

Two deployments side by side, each a SuperLink with TLS and SuperNode authentication
and 3 SuperNodes with their own image folders (the same folders in both):

- ``warm``: every SuperNode is a warm device (a SuperExec that forks each message's
  ClientApp from a process that imported torch once). Three runs submitted together:
  ``same`` (Per-FedAvg, 1 round: a preflight, a fit and an evaluation message per node),
  ``changed`` (the same from a copy of the app with one more function: a new FAB) and
  ``killed`` (2 rounds, more local steps), in which node 0's ClientApp child is
  SIGKILLed while it trains in round 2.
- ``cold``: Flower's own executor (a fresh ``flwr-clientapp`` per message), run ``same``.

The warm ``same`` run must equal the cold one in ``metrics.jsonl`` apart from timings;
``changed`` must run the new code on every node (the preflight compares each node's code
fingerprint with the server's, and leaves a stale device out); ``killed`` must record
node 0's failure in round 2 (Flower answers a dead task's message with an error once
its heartbeat lapses, 60 s in Flower 1.42) and then serve node 0's evaluation in that round.
The three runs share node 0, which runs one message at a time: that wait holds up all of
them, and the test takes about 3 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO
from helpers import summaries_written

from app.device.fork_server import TASK_NAME
from app.local.deployment import LocalDeployment
from app.local.processes import group_processes, live_processes
from app.local.simulation import FINISHED_OK
from datasets.tools.device_folders import CLASSES, INPUT_SHAPE, make_device_folders
from strategies.contracts.code import code_fingerprint
from strategies.rounds.records import TIMING_KEYS

pytestmark = pytest.mark.e2e
RUN_TIMEOUT_S = 400
# A `killed` child past this is training: its message takes ~3.3 CPU-s (~2.8 of them its fit). After round 1
# a child of the other runs stays under ~0.7 CPU-s (Flower's part ~0.3, their fits ~0.1). With 150 steps the
# killed message took ~1.0 CPU-s, right at this line, and the test failed when it fell just short.
KILL_AFTER_CPU_S = 1.0
KILLED_LOCAL_STEPS = 600
# the runs compared warm against cold and old FAB against new: every kind of message once per node (each cold one
# starts a flwr-clientapp, about 5 CPU-s here); the killed run keeps 2 rounds
ONE_ROUND = {"num-server-rounds": 1, "eval-every": 1}


def config(results: Path, name: str, **change: object) -> dict[str, object]:
    return {"strategy": "perfedavg", "dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
            "num-server-rounds": 2, "fraction-fit": 1.0, "eval-every": 2, "min-fit-clients": 2,
            "min-available-clients": 3, "results-dir": str(results), "run-name": name, **change}  # fmt: skip


def changed_app(where: Path) -> Path:
    """A copy of the app whose ``clients/training.py`` has one more function: another FAB, another fingerprint."""
    top = shutil.ignore_patterns(".git", "results", "tests", "bench", "docs", ".ci", "*.egg-info", "build")
    everywhere = shutil.ignore_patterns("__pycache__")  # app/results/ is code: only the top's results/ is output

    def ignored(folder: str, names: list[str]) -> set[str]:
        return everywhere(folder, names) | (top(folder, names) if Path(folder) == REPO else set())

    shutil.copytree(REPO, where, ignore=ignored)
    with (where / "clients" / "training.py").open("a") as handle:
        handle.write('\n\ndef changed_for_the_warm_test() -> None:\n    """Only here to change the FAB."""\n')
    return where


def task_children(group: int) -> list[int]:
    """Pids of the warm executor's task children in process group ``group``."""
    found = []
    for pid in group_processes([group]):
        try:
            if Path(f"/proc/{pid}/comm").read_bytes().strip() == TASK_NAME:
                found.append(pid)
        except OSError:  # it ended while we looked
            continue
    return found


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kill_a_training_child(deployment: LocalDeployment, partition: int, metrics: Path, deadline: float) -> float:
    """Once round 1 is recorded in ``metrics``, SIGKILL the node's next task child that trains; its CPU-s.

    Not before: a node's first message decodes its image folder (about 1 CPU-s) and would
    look like training.
    """
    while not (metrics.exists() and metrics.read_text().strip()):
        if time.monotonic() > deadline:
            raise TimeoutError("round 1 was never recorded")
        time.sleep(0.2)
    group = deployment.nodes[partition].process.pid
    while time.monotonic() < deadline:
        for pid in task_children(group):
            used = cpu_seconds(pid)
            if used >= KILL_AFTER_CPU_S:
                os.kill(pid, signal.SIGKILL)
                return used
        time.sleep(0.02)
    raise TimeoutError(f"no task child of node {partition} trained for {KILL_AFTER_CPU_S} CPU-s")


def warm_scenario(workdir: Path, devices: list[Path]) -> dict:
    results = workdir / "results"
    changed = changed_app(workdir / "changed-app")
    # numbered: the warm and the cold deployment must train the same partitions' batches to give one run
    with LocalDeployment(app_dir=REPO, num_nodes=3, tls=True, node_auth=True, node_data=devices, numbered=True,
                         warm=True, workdir=workdir / "deployment") as deployment:  # fmt: skip
        # together: the killed run's 60 s wait for Flower's verdict overlaps the other two
        runs = {"same": deployment.submit(config(results, "same", **ONE_ROUND)),
                "changed": deployment.submit(config(results, "changed", **ONE_ROUND), app_dir=changed),
                "killed": deployment.submit(config(results, "killed", **{"local-steps": KILLED_LOCAL_STEPS}))}
        killed_at_cpu = kill_a_training_child(deployment, 0, results / "killed" / "metrics.jsonl",
                                              time.monotonic() + RUN_TIMEOUT_S)  # fmt: skip
        statuses = deployment.wait_all(list(runs.values()), timeout_s=RUN_TIMEOUT_S, poll_s=30,
                                       ready=summaries_written(results, runs))  # fmt: skip
        node_logs = [node.log_path.read_text(errors="replace") for node in deployment.nodes.values()]
    return {"statuses": {name: statuses[run_id] for name, run_id in runs.items()}, "results": results,
            "changed-fingerprint": code_fingerprint(changed), "killed-at-cpu": killed_at_cpu,
            "node-logs": node_logs, "groups": deployment.process_groups()}  # fmt: skip


def cold_scenario(workdir: Path, devices: list[Path]) -> dict:
    results = workdir / "results"
    with LocalDeployment(app_dir=REPO, num_nodes=3, tls=True, node_auth=True, node_data=devices, numbered=True,
                         workdir=workdir / "deployment") as deployment:  # fmt: skip
        outcome = deployment.run(config(results, "same", **ONE_ROUND), timeout_s=RUN_TIMEOUT_S)
        node_logs = [node.log_path.read_text(errors="replace") for node in deployment.nodes.values()]
    return {"status": outcome.status, "log": outcome.log[-3000:], "results": results, "node-logs": node_logs,
            "groups": deployment.process_groups()}  # fmt: skip


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, Future]:
    devices = make_device_folders(tmp_path_factory.mktemp("devices"), devices=3, train_per_class=6,
                                  test_per_class=3)  # fmt: skip
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {name: pool.submit(function, tmp_path_factory.mktemp(name), devices)
               for name, function in (("warm", warm_scenario), ("cold", cold_scenario))}  # fmt: skip
    yield futures
    pool.shutdown(wait=True)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timings(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records(run_dir)]


def test_a_warm_device_gives_the_cold_path_results(scenarios):
    warm, cold = scenarios["warm"].result(), scenarios["cold"].result()
    assert cold["status"] == FINISHED_OK, cold["log"]
    assert warm["statuses"]["same"] == FINISHED_OK
    assert all("fork server ready" in log for log in warm["node-logs"])  # the warm path ran, on every node
    assert not any("fork server" in log for log in cold["node-logs"])
    same = without_timings(warm["results"] / "same")
    assert [r["round"] for r in same] == [1] and same[-1]["eval-clients"] == 3
    assert same == without_timings(cold["results"] / "same")


def test_a_changed_app_reaches_warm_devices(scenarios):
    warm = scenarios["warm"].result()
    assert warm["statuses"]["changed"] == FINISHED_OK
    summary = json.loads((warm["results"] / "changed" / "summary.json").read_text())
    # the server runs the new FAB, and every node passed the preflight's comparison with it
    assert summary["provenance"]["code"]["fingerprint"] == warm["changed-fingerprint"] != code_fingerprint(REPO)
    assert not summary.get("nodes-left-out") and len(summary["nodes"]) == 3
    assert [r["clients-succeeded"] for r in records(warm["results"] / "changed")] == [3]
    # both apps were kept warm in turn on each node: the fork server followed the FAB hash
    for log in warm["node-logs"]:
        assert len({line.split(" app ")[1].split()[0] for line in log.splitlines() if " warm (" in line}) == 2


def test_a_killed_task_child_fails_its_message_and_the_next_is_served(scenarios):
    warm = scenarios["warm"].result()
    assert warm["killed-at-cpu"] >= KILL_AFTER_CPU_S
    assert warm["statuses"]["killed"] == FINISHED_OK
    rounds = records(warm["results"] / "killed")
    assert [r["round"] for r in rounds] == [1, 2]
    assert rounds[0]["clients-succeeded"] == 3
    assert rounds[1]["clients-failed"] == 1 and rounds[1]["clients-succeeded"] == 2
    assert "ClientApp stopped responding" in rounds[1]["fit-failures"][0]
    assert rounds[1]["eval-clients"] == 3  # the node's next message (its evaluation) was served
    assert "killed by signal 9" in warm["node-logs"][0]


def test_every_warm_process_is_stopped(scenarios):
    for name, future in scenarios.items():
        left = live_processes(future.result()["groups"])
        assert left == [], f"{name}: processes {left} are still running"
