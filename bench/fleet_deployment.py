"""Benchmark B11, its deployment half: lockstep against buffered rounds on a loopback fleet, in wall time.

A real deployment on this machine (``app/local/deployment.py``, warm devices): a SuperLink over TLS with
SuperNode authentication and 8 SuperNodes, two of them emulating devices 5x slower
(``emulated-slowdown``, docs/fleets.md), one killed (SIGKILL, a device losing power) once the
run has recorded its second update. FedAvg on the embedded data, the server testing the
global model after every update (``central-eval``), ``deadline`` seconds for a round (lockstep)
or a job (buffered). Each pace gets a deployment of its own. Recorded: every update's wall
time since the run began and its global accuracy; the target is lockstep's final accuracy,
and each pace's time to it is its first update at or above it.

    python -m bench.fleet_deployment --quick   # 3 lockstep rounds, 6 buffered updates: bench/results/quick
    python -m bench.fleet_deployment           # 10 rounds against 20 updates
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from app.local.deployment import LocalDeployment
from bench.harness import REPO, arguments, stamp

NODES, SLOWED, LEAVES = 8, {6: 5.0, 7: 5.0}, 5
DEADLINE_S = 30.0
CONFIG = {"strategy": "fedavg", "central-eval": True, "fraction-fit": 1.0, "min-fit-clients": 2,
          "min-available-clients": NODES, "local-steps": 50, "fraction-evaluate": 0.0, "deadline": DEADLINE_S}
PACES = {"lockstep": {"pace": "lockstep"}, "buffered": {"pace": "buffered", "concurrency": NODES, "buffer-size": 4}}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_pace(pace: str, updates: int, folder: Path) -> dict:
    """One deployment, one run of ``pace``; the node of partition ``LEAVES`` is killed after the 2nd update."""
    config = {**CONFIG, **PACES[pace], "num-server-rounds": updates, "results-dir": str(folder), "run-name": pace}
    metrics = folder / pace / "metrics.jsonl"
    with LocalDeployment(app_dir=REPO, num_nodes=NODES, tls=True, node_auth=True, slowed=SLOWED,
                         warm=True) as deployment:  # fmt: skip
        run_id = deployment.submit(config)
        give_up = time.monotonic() + 600
        while len(records(metrics)) < 2 and time.monotonic() < give_up:
            time.sleep(0.2)
        deployment.kill_node(LEAVES)
        killed_at = records(metrics)[-1]["elapsed-seconds"] if records(metrics) else None
        outcome = deployment.wait(run_id, timeout_s=900)
    rows = records(metrics)
    return {"pace": pace, "status": outcome.status, "killed-after-seconds": killed_at,
            "curve": [(r["elapsed-seconds"], r.get("central-accuracy")) for r in rows],
            "failed": sum(r.get("clients-failed", 0) for r in rows),
            "left": sum(r.get("clients-left", 0) for r in rows),
            "round-seconds": [r.get("round-seconds") for r in rows]}  # fmt: skip


def main() -> None:
    # a SIGTERM (``timeout``) ends the run as Ctrl-C does, so the deployment's context stops every process it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = arguments(__doc__, out="fleet_deployment.json", quick="3 lockstep rounds, 6 buffered updates")
    args = parser.parse_args()
    rounds = 3 if args.quick else 10
    with tempfile.TemporaryDirectory(prefix="stamen-b11-") as folder:
        runs = {pace: one_pace(pace, rounds * (2 if pace == "buffered" else 1), Path(folder)) for pace in PACES}
    target = runs["lockstep"]["curve"][-1][1]

    def first(curve: list) -> float | None:
        return next((t for t, accuracy in curve if accuracy is not None and accuracy >= target), None)

    times = {pace: first(run["curve"]) for pace, run in runs.items()}
    report = {"benchmark": "B11 deployment", **stamp(),
              "nodes": NODES, "slowed": SLOWED, "leaves": LEAVES, "deadline-seconds": DEADLINE_S, "target": target,
              "time-to-target": times, "ratio": (times["buffered"] / times["lockstep"]
                                                 if times["buffered"] and times["lockstep"] else None),
              "runs": runs}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
