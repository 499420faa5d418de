"""What a deployed round costs: compute, and the wait around it, with Flower's pull intervals and with stamen's.

Each case is a loopback deployment (``app.local.deployment.LocalDeployment``) over TLS with
SuperNode authentication, every SuperNode a device with its own MNIST image folder
(``datasets.tools.device_folders``: 20 images per class, 12 when 20 devices share the
sample), running FedAvg (5 local steps) with every node training and evaluating every
round. Three settings of the waits, in one run, alternating:

- ``flower``: Flower 1.42's intervals: the server pulls its replies every 3 s
  (``pull-interval = 3``: what ``HttpGrid.send_and_receive`` sleeps) and each device's
  SuperExec asks for a task every 1 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=1``, Flower's
  default); each round's phases one after the other (``overlap-rounds = false``);
- ``stamen, apart``: stamen's intervals (``pull-interval`` and ``stamen-device --task-poll``),
  the phases one after the other;
- ``stamen``: stamen's defaults: its intervals, and each round's evaluation sent with the
  next round's fit (``overlap-rounds``).

Devices are ``cold`` (Flower's executor: a fresh process per message) or ``warm``
(``app.device.console``). Per round: its wall time (from the previous round's close to its own; the
first round from its fit), its compute
(per phase, the slowest node's ClientApp wall time from its process start to its reply,
from ``STAMEN_PROFILE``; fit plus evaluate) and the wait (the rest). Per case: the
SuperLink's and the ServerApp's CPU per second of run, the server's pulls per second (its
log line), and each device's idle CPU per second (10 s, before the run).

    python -m bench.edge_rounds               # 4 nodes, cold and warm, 10 rounds; 20 warm nodes, 3 rounds
    python -m bench.edge_rounds --quick       # 4 warm nodes, 4 rounds
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from app.device.console import TASK_POLL, TASK_POLL_ENV
from app.local.deployment import LocalDeployment
from app.local.simulation import FINISHED_OK
from bench.deploy_setup import Env, node_cpus, read_profile, settled
from bench.harness import REPO, arguments, machine, results_folder, write_report
from datasets.tools.device_folders import CLASSES, INPUT_SHAPE, make_device_folders

WAITS = {"flower": {"pull-interval": 3.0, "task-poll": 1.0, "overlap-rounds": False},
         "stamen, apart": {"pull-interval": None, "task-poll": None, "overlap-rounds": False},
         "stamen": {"pull-interval": None, "task-poll": None, "overlap-rounds": None}}  # None: the default  # fmt: skip
PULLS = re.compile(r"stamen: (\d+) pulls of replies in ([\d.]+) s")


def run_config(nodes: int, rounds: int, results: Path, name: str, waits: dict) -> dict:
    config = {"strategy": "fedavg", "dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
              "num-server-rounds": rounds, "fraction-fit": 1.0, "fraction-evaluate": 1.0, "eval-every": 1,
              "min-fit-clients": nodes, "min-available-clients": nodes, "local-steps": 5,
              "results-dir": str(results), "run-name": name}  # fmt: skip
    config.update({key: value for key, value in waits.items() if key != "task-poll" and value is not None})
    return config


def case(folders: list[Path], rounds: int, work: Path, *, warm: bool, waits: dict) -> dict:
    """One deployment and run; its rounds (wall, compute, wait) and what the waiting cost."""
    profile = work / "profile.jsonl"
    node_env = {TASK_POLL_ENV: f"{waits['task-poll']:g}"} if waits["task-poll"] else {}
    if not warm and not waits["task-poll"]:  # a cold device as `stamen-device --cold` starts it
        node_env = {TASK_POLL_ENV: f"{TASK_POLL:g}"}
    with Env(STAMEN_PROFILE=str(profile), STAMEN_CACHE_DIR=str(work / "cache")):
        with LocalDeployment(app_dir=REPO, num_nodes=len(folders), node_data=folders, warm=warm, tls=True,
                             node_auth=True, node_env=node_env, workdir=work / "deployment") as deployment:  # fmt: skip
            roots = [node.process.pid for node in deployment.nodes.values()]
            settled(roots)
            idle_start, started = node_cpus(roots), time.monotonic()
            time.sleep(10)
            idle = [(sum(b.values()) - sum(a.values())) / (time.monotonic() - started)
                    for a, b in zip(idle_start, node_cpus(roots), strict=True)]  # fmt: skip
            server = [deployment.superlink.process.pid]
            cpu_before, wall_before = total_cpu(server), time.monotonic()
            config = run_config(len(folders), rounds, work / "results", "rounds", waits)
            run_id = deployment.submit(config)
            # `flwr log --stream` can drop out on a loaded machine (20 devices on 2 cores): wait on the status
            summary = work / "results" / "rounds" / "summary.json"
            status = deployment.wait_all([run_id], timeout_s=1800, poll_s=5, ready=summary.exists)[run_id]
            server_cpu = (total_cpu(server) - cpu_before) / (time.monotonic() - wall_before)
            log = deployment.cli.follow(run_id, timeout_s=120)  # the finished run's whole log
    if status != FINISHED_OK:
        raise RuntimeError(f"deployment run ended {status}:\n{log[-3000:]}")
    metrics = work / "results" / "rounds" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    compute = compute_per_round(read_profile(profile))
    # overlapped rounds begin before the last one closes: a round's wall is the time between two closes
    closes = [r["elapsed-seconds"] for r in records]
    walls = [records[0]["round-seconds"], *(b - a for a, b in pairwise(closes))]
    computes = [compute.get(str(r["round"]), 0.0) for r in records]
    pulls = PULLS.search(log)
    return {"round-seconds": walls, "compute-seconds": computes,
            "wait-seconds": [w - c for w, c in zip(walls, computes, strict=True)],
            "server-cpu-per-s": server_cpu, "device-idle-cpu-per-s": idle,
            "pulls-per-s": int(pulls[1]) / float(pulls[2]) if pulls else None}  # fmt: skip


def total_cpu(roots: list[int]) -> float:
    """CPU seconds of the process trees under ``roots`` (living members, with what they reaped)."""
    return sum(sum(tree.values()) for tree in node_cpus(roots))


def compute_per_round(messages: list[dict]) -> dict[str, float]:
    """Per round: the slowest node's ClientApp wall time for its fit, plus the slowest for its evaluation."""
    slowest: dict[tuple[str, str], float] = {}
    for message in messages:
        if message["kind"] not in ("train", "evaluate"):
            continue
        wall = sum(phase["wall"] for phase in message["phases"].values())
        key = (str(message["round"]), message["kind"])
        slowest[key] = max(slowest.get(key, 0.0), wall)
    rounds: dict[str, float] = {}
    for (server_round, _), wall in slowest.items():
        rounds[server_round] = rounds.get(server_round, 0.0) + wall
    return rounds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(result: dict) -> dict:
    return {"round-median": statistics.median(result["round-seconds"]),
            "round-p90": percentile(result["round-seconds"], 0.9),
            "compute-median": statistics.median(result["compute-seconds"]),
            "wait-median": statistics.median(result["wait-seconds"]),
            "server-cpu-per-s": result["server-cpu-per-s"],
            "device-idle-cpu-per-s": statistics.median(result["device-idle-cpu-per-s"]),
            "pulls-per-s": result["pulls-per-s"]}  # fmt: skip


def table(cases: dict[str, dict]) -> str:
    lines = ["| case | round s, median | round s, p90 | compute s / round | wait s / round | server pulls / s | "
             "SuperLink + ServerApp CPU-s / s | idle device CPU-s / s |", "|---" * 8 + "|"]  # fmt: skip
    for name, result in cases.items():
        s = summary(result)
        pulls = f"{s['pulls-per-s']:.1f}" if s["pulls-per-s"] is not None else "-"
        lines.append(f"| {name} | {s['round-median']:.2f} | {s['round-p90']:.2f} | {s['compute-median']:.2f} | "
                     f"{s['wait-median']:.2f} | {pulls} | {s['server-cpu-per-s']:.3f} | "
                     f"{s['device-idle-cpu-per-s']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = arguments(__doc__, quick="4 warm nodes, 4 rounds")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--scale-nodes", type=int, default=20)
    args = parser.parse_args()
    plan = [(args.scale_nodes, True, waits, 3) for waits in WAITS] if args.scale_nodes else []
    plan += [(4, warm, waits, args.rounds) for warm in (False, True) for waits in WAITS]
    if args.quick:
        plan = [(4, True, waits, 4) for waits in WAITS]
    cases: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="stamen-edge-") as scratch:
        largest = max(n for n, *_ in plan)  # the MNIST sample holds 250 training images of its rarest digit
        folders = make_device_folders(Path(scratch) / "devices", devices=largest,
                                      train_per_class=min(20, 240 // largest), test_per_class=5)  # fmt: skip
        for nodes, warm, waits, rounds in plan:
            name = f"{nodes} {'warm' if warm else 'cold'}, {waits}"
            started = time.monotonic()
            cases[name] = case(folders[:nodes], rounds, Path(scratch) / re.sub(r"[^a-z0-9]+", "-", name),
                               warm=warm, waits=WAITS[waits])  # fmt: skip
            print(f"[{time.monotonic() - started:5.0f} s] {name}: {summary(cases[name])}", flush=True)
    report = {"machine": machine(), "waits": WAITS, "cases": cases,
              "summary": {name: summary(result) for name, result in cases.items()}}
    markdown = table(cases)
    print(markdown)
    write_report(results_folder(args.quick) / "edge_rounds.json", report, markdown + "\n")


if __name__ == "__main__":
    main()
