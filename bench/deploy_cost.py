"""What one message costs a deployed device, before and after cutting what the app controls; simulation beside it.

A SuperNode starts a fresh ``flwr-clientapp`` process for every message it gets. With
``STAMEN_PROFILE`` set, stamen's ClientApp appends each message's wall and CPU seconds
per phase (``app/message_cost.py``): ``flower`` (process start, Flower's imports, the FAB
and the message, up to stamen's import), ``imports`` (torch and stamen), ``data``,
``build`` (settings, model, client) and ``work`` (training, evaluation or the
preflight's check).

Each case is a loopback deployment (``app.deploy.LocalDeployment``) of 2 or 4 SuperNodes,
each with its own image folder of MNIST digits (200 training images, written by
``datasets.tools.device_folders``), running Per-FedAvg HF (tau 10, batches of 10) for
``--rounds`` rounds with every node training each round and evaluating in the last:
``nodes * (rounds + 2)`` messages (preflight, fits, evaluations). ``before`` runs the app
at ``--before`` (a git worktree; default: the commit that added the profile, before the
cuts), ``after`` at HEAD; they alternate ``--repeats`` times. ``simulation`` runs the same
work through Flower's simulation engine (``app.launcher.LocalSimulation``, the nodes'
folders merged into one and split iid), where a Ray worker pays for its process and
imports once. Medians are over every message of a case.

    python bench/deploy_cost.py            # 2 and 4 SuperNodes, 2 repeats (~12 min): bench/results/deploy_cost.json
    python bench/deploy_cost.py --quick    # 2 SuperNodes, 1 repeat, 2 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import QUICK_RESULTS, REPO, machine

sys.path.insert(0, str(REPO))

from app.deploy import LocalDeployment  # noqa: E402
from app.launcher import FINISHED_OK, LocalSimulation  # noqa: E402
from datasets.tools.device_folders import CLASSES, INPUT_SHAPE, make_device_folders  # noqa: E402

BEFORE = "63c890c"  # the per-message profile, before the cuts (torchvision on every data load, all files in the FAB)
PHASES = ("flower", "imports", "data", "build", "work")
TRAIN_PER_CLASS, TEST_PER_CLASS = 20, 5


def run_config(rounds: int, results: Path, name: str) -> dict[str, object]:
    return {"strategy": "perfedavg", "dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
            "num-server-rounds": rounds, "fraction-fit": 1.0, "eval-every": rounds, "min-fit-clients": 2,
            "results-dir": str(results), "run-name": name}  # fmt: skip


class Env:
    """Set environment variables for the processes started inside the block (they copy ``os.environ``)."""

    def __init__(self, **values: str) -> None:
        self.values, self.saved = values, {}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_profile(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def fab_bytes(app_dir: Path) -> int:
    from flwr.cli.build import build_fab_from_disk

    return len(build_fab_from_disk(app_dir))


def deployment_case(app_dir: Path, devices: list[Path], rounds: int, work: Path) -> dict:
    profile, cache = work / "profile.jsonl", work / "cache"  # a fresh cache: each device decodes its folder once
    with Env(STAMEN_PROFILE=str(profile), STAMEN_CACHE_DIR=str(cache)):
        started = time.perf_counter()
        with LocalDeployment(app_dir=app_dir, num_nodes=len(devices), node_data=devices,
                             workdir=work / "deployment") as deployment:  # fmt: skip
            outcome = deployment.run(run_config(rounds, work / "results", "cost"), timeout_s=900)
            node_cpu = [_node_cpu(node.process.pid) for node in deployment.nodes.values()]
        wall = time.perf_counter() - started
    if outcome.status != FINISHED_OK:
        raise RuntimeError(f"deployment run ended {outcome.status}:\n{outcome.log[-3000:]}")
    return {"messages": read_profile(profile), "run-wall": outcome.wall_seconds, "case-wall": wall,
            "supernode-cpu": node_cpu}  # fmt: skip


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _node_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a SuperNode's process tree: itself, and its descendants with the processes they reaped.

    The SuperNode starts a SuperExec, which starts one ClientApp process per message and
    reaps it: a finished ClientApp's CPU is in the SuperExec's children's time.
    """
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(children)
        frontier = children
    tick = os.sysconf("SC_CLK_TCK")
    totals = {"supernode": 0.0, "descendants": 0.0}
    for member in tree:
        try:
            fields = _stat(member)
        except OSError:
            continue
        seconds = sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick
        totals["supernode" if member == pid else "descendants"] += seconds
    return totals


def simulation_case(app_dir: Path, folder: Path, nodes: int, rounds: int, work: Path) -> dict:
    profile = work / "profile.jsonl"
    config = {**run_config(rounds, work / "results", "cost"), "data-dir": str(folder), "partitioner": "iid"}
    with Env(STAMEN_PROFILE=str(profile), STAMEN_CACHE_DIR=str(work / "cache")):
        with LocalSimulation(app_dir=app_dir, workdir=work / "cwd") as simulation:
            outcome = simulation.run(run_config=config, num_supernodes=nodes, timeout_s=900,
                                     extra_federation=f"client-resources-num-cpus={max(1, 2 // nodes)}")  # fmt: skip
    if outcome.status != FINISHED_OK:
        raise RuntimeError(f"simulation ended {outcome.status}:\n{outcome.log_tail}")
    return {"messages": read_profile(profile), "run-wall": outcome.wall_seconds}


def summarise(messages: list[dict]) -> dict:
    """Per-message medians of every phase and of the total, and the mean total (which spreads one-off costs)."""
    out: dict[str, object] = {"messages": len(messages)}
    for measure in ("wall", "cpu"):
        per_phase = {p: statistics.median(m["phases"].get(p, {}).get(measure, 0.0) for m in messages) for p in PHASES}
        totals = [sum(m["phases"].get(p, {}).get(measure, 0.0) for p in PHASES) for m in messages]
        out[measure] = {**per_phase, "total-median": statistics.median(totals), "total-mean": statistics.mean(totals)}
    return out


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)  # fmt: skip
    return where


def table(results: dict) -> str:
    """CPU-seconds per message: the phases' medians, the total, and the whole device's (SuperNode's tree) mean."""
    lines = ["| SuperNodes | case | " + " | ".join(PHASES) + " | ClientApp total, median (mean) | whole device |",
             "|---" * (len(PHASES) + 4) + "|"]  # fmt: skip
    for nodes, cases in results["cases"].items():
        for name, summary in cases.items():
            cpu = summary["cpu"]
            cells = " | ".join(f"{cpu[p]:.2f}" for p in PHASES)
            device = results["device-cpu-per-message"].get(nodes, {}).get(name)
            whole = f"{statistics.median(device):.2f}" if device else "-"
            lines.append(f"| {nodes} | {name} | {cells} | {cpu['total-median']:.2f} ({cpu['total-mean']:.2f}) | "
                         f"{whole} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 SuperNodes, 1 repeat, 2 rounds")
    parser.add_argument("--before", default=BEFORE, help=f"the app's revision before the cuts (default {BEFORE})")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    node_counts, repeats, rounds = ((2,), 1, 2) if args.quick else ((2, 4), args.repeats, args.rounds)
    out_dir = QUICK_RESULTS if args.quick else REPO / "bench" / "results"
    scratch = Path(tempfile.mkdtemp(prefix="stamen-deploy-cost-"))
    try:
        apps = {"before": worktree(args.before, scratch / "before"), "after": worktree("HEAD", scratch / "after")}
        largest = max(node_counts)
        devices = make_device_folders(scratch / "devices", devices=largest, train_per_class=TRAIN_PER_CLASS,
                                      test_per_class=TEST_PER_CLASS)  # fmt: skip
        merged = {n: make_device_folders(scratch / f"merged-{n}", devices=1, train_per_class=TRAIN_PER_CLASS * n,
                                         test_per_class=TEST_PER_CLASS * n)[0] for n in node_counts}  # fmt: skip
        raw: dict[int, dict[str, list]] = {n: {"before": [], "after": [], "simulation": []} for n in node_counts}
        walls: dict[int, dict[str, list]] = {n: {"before": [], "after": [], "simulation": []} for n in node_counts}
        device_cpu: dict[int, dict[str, list]] = {n: {"before": [], "after": []} for n in node_counts}
        for repeat in range(repeats):
            for n in node_counts:
                for variant in ("before", "after"):
                    work = scratch / f"{variant}-{n}-{repeat}"
                    print(f"repeat {repeat + 1}/{repeats}: {n} SuperNodes, {variant}", flush=True)
                    case = deployment_case(apps[variant], devices[:n], rounds, work)
                    raw[n][variant] += case["messages"]
                    walls[n][variant].append(case["run-wall"])
                    trees = case["supernode-cpu"]
                    device_cpu[n][variant].append(sum(t["supernode"] + t["descendants"] for t in trees)
                                                  / len(case["messages"]))  # fmt: skip
                    shutil.rmtree(work, ignore_errors=True)
                work = scratch / f"simulation-{n}-{repeat}"
                print(f"repeat {repeat + 1}/{repeats}: {n} clients, simulation", flush=True)
                case = simulation_case(apps["after"], merged[n], n, rounds, work)
                raw[n]["simulation"] += case["messages"]
                walls[n]["simulation"].append(case["run-wall"])
                shutil.rmtree(work, ignore_errors=True)
        results = {
            "benchmark": "deploy_cost", "machine": machine(), "before": args.before,
            "after": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
            "rounds": rounds, "repeats": repeats, "train-images-per-node": TRAIN_PER_CLASS * 10,
            "fab-bytes": {name: fab_bytes(app) for name, app in apps.items()},
            "cases": {n: {name: summarise(messages) for name, messages in cases.items()} for n, cases in raw.items()},
            "run-wall-seconds": walls, "device-cpu-per-message": device_cpu,
        }  # fmt: skip
    finally:
        for name in ("before", "after"):
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(scratch / name)],
                           capture_output=True)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "deploy_cost.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "deploy_cost.md").write_text(table(results) + "\n")
    print(table(results))
    print(f"wrote {out_dir / 'deploy_cost.json'}")


if __name__ == "__main__":
    main()
