"""What one message costs a deployed device, cold (Flower's executor) and warm (``stamen-device``), and in a simulation.

A SuperNode with Flower's executor starts a fresh ``flwr-clientapp`` process for every
message it gets; a warm device (``python -m app.device.console``, ``app/device/warm_exec.py``) forks
each message's process from one that imported torch, numpy and Flower once. With
``STAMEN_PROFILE`` set, stamen's ClientApp appends each message's wall and CPU seconds
per phase (``app/message_cost.py``): ``flower`` (process start, Flower's imports, the FAB
and the message, up to stamen's import; in a warm child, the fork to the message reaching
stamen), ``imports`` (torch and stamen), ``data``, ``build`` (settings, model, client)
and ``work`` (training, evaluation or the preflight's check).

Each case is a loopback deployment (``app.local.deployment.LocalDeployment``) of 2 or 4 SuperNodes,
each with its own image folder of MNIST digits (200 training images, written by
``datasets.tools.device_folders``), running Per-FedAvg HF (tau 10, batches of 10) for
``--rounds`` rounds with every node training each round and evaluating in the last:
``nodes * (rounds + 2)`` messages (preflight, fits, evaluations). ``now`` runs every
SuperNode with Flower's executor, ``warm`` as a warm device, both at HEAD; they alternate
``--repeats`` times. ``simulation`` runs the same work through Flower's simulation engine
(``app.local.simulation.LocalSimulation``, the nodes' folders merged into one and split iid),
where a Ray worker pays for its process and imports once. Medians are over every message
of a case.

Besides the ClientApp's phases, per device: the CPU-seconds of its whole process tree
(SuperNode, SuperExec, fork server, every ClientApp process it reaped) per message, with
and without what the device spent before the run (starting and importing, until every
device's tree idles under 0.05 CPU-s per second), and the
peak memory of that tree, sampled every 0.2 s: the sum of PSS (shared pages split
between the processes that share them, so a fork server and its children are not
counted twice) and, for reference, the sum of RSS.

    python -m bench.deploy_cost            # 2 and 4 SuperNodes, 2 repeats (~15 min): bench/results/deploy_cost.json
    python -m bench.deploy_cost --quick    # 2 SuperNodes, 1 repeat, 2 rounds
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from app.local.deployment import LocalDeployment
from app.local.simulation import FINISHED_OK
from bench.deploy_setup import Env, node_cpus, read_profile, settled
from bench.harness import REPO, arguments, local_simulation, machine, results_folder, write_report
from bench.samplers import MemorySampler
from datasets.tools.device_folders import CLASSES, INPUT_SHAPE, make_device_folders

PHASES = ("flower", "imports", "data", "build", "work")
VARIANTS = ("now", "warm")
TRAIN_PER_CLASS, TEST_PER_CLASS = 20, 5


def run_config(rounds: int, results: Path, name: str) -> dict[str, object]:
    return {"strategy": "perfedavg", "dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
            "num-server-rounds": rounds, "fraction-fit": 1.0, "eval-every": rounds, "min-fit-clients": 2,
            "results-dir": str(results), "run-name": name}  # fmt: skip


def fab_bytes(app_dir: Path) -> int:
    from flwr.cli.build import build_fab_from_disk

    return len(build_fab_from_disk(app_dir))


def deployment_case(app_dir: Path, devices: list[Path], rounds: int, work: Path, *, warm: bool) -> dict:
    profile, cache = work / "profile.jsonl", work / "cache"  # a fresh cache: each device decodes its folder once
    with Env(STAMEN_PROFILE=str(profile), STAMEN_CACHE_DIR=str(cache)):
        started = time.perf_counter()
        with LocalDeployment(app_dir=app_dir, num_nodes=len(devices), node_data=devices, warm=warm,
                             workdir=work / "deployment") as deployment:  # fmt: skip
            roots = [node.process.pid for node in deployment.nodes.values()]
            before = settled(roots)  # every device connected and (warm) its fork server ready: what starting cost
            with MemorySampler(roots) as memory:
                outcome = deployment.run(run_config(rounds, work / "results", "cost"), timeout_s=900)
            node_cpu = node_cpus(roots)
        wall = time.perf_counter() - started
    if outcome.status != FINISHED_OK:
        raise RuntimeError(f"deployment run ended {outcome.status}:\n{outcome.log[-3000:]}")
    return {"messages": read_profile(profile), "run-wall": outcome.wall_seconds, "case-wall": wall,
            "supernode-cpu": node_cpu, "before-run-cpu": before, "peak-memory": memory.peaks()}  # fmt: skip


def simulation_case(app_dir: Path, folder: Path, nodes: int, rounds: int, work: Path) -> dict:
    profile = work / "profile.jsonl"
    config = {**run_config(rounds, work / "results", "cost"), "data-dir": str(folder), "partitioner": "iid"}
    with Env(STAMEN_PROFILE=str(profile), STAMEN_CACHE_DIR=str(work / "cache")):
        with local_simulation(app_dir=app_dir, workdir=work / "cwd") as simulation:
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
    """Per message: the ClientApp's CPU-s by phase, its total and wall; per device: CPU-s and peak memory."""
    lines = ["| SuperNodes | case | " + " | ".join(PHASES) + " | ClientApp CPU-s, median (mean) | ClientApp wall s | "
             "device CPU-s, with start | device CPU-s, run only | device peak PSS MiB (RSS) |",
             "|---" * (len(PHASES) + 7) + "|"]  # fmt: skip
    for nodes, cases in results["cases"].items():
        for name, summary in cases.items():
            cpu, wall = summary["cpu"], summary["wall"]
            cells = " | ".join(f"{cpu[p]:.2f}" for p in PHASES)
            device = results["device"].get(nodes, {}).get(name)
            if device:
                memory = f"{statistics.median(device['peak-pss']):.0f} ({statistics.median(device['peak-rss']):.0f})"
                whole = f"{statistics.median(device['cpu-per-message']):.2f} | " \
                        f"{statistics.median(device['run-cpu-per-message']):.2f} | {memory}"
            else:
                whole = "- | - | -"
            lines.append(f"| {nodes} | {name} | {cells} | {cpu['total-median']:.2f} ({cpu['total-mean']:.2f}) | "
                         f"{wall['total-median']:.2f} | {whole} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = arguments(__doc__, quick="2 SuperNodes, 1 repeat, 2 rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    node_counts, repeats, rounds = ((2,), 1, 2) if args.quick else ((2, 4), args.repeats, args.rounds)
    out_dir = results_folder(args.quick)
    scratch = Path(tempfile.mkdtemp(prefix="stamen-deploy-cost-"))
    try:
        app = worktree("HEAD", scratch / "app")
        largest = max(node_counts)
        devices = make_device_folders(scratch / "devices", devices=largest, train_per_class=TRAIN_PER_CLASS,
                                      test_per_class=TEST_PER_CLASS)  # fmt: skip
        merged = {n: make_device_folders(scratch / f"merged-{n}", devices=1, train_per_class=TRAIN_PER_CLASS * n,
                                         test_per_class=TEST_PER_CLASS * n)[0] for n in node_counts}  # fmt: skip
        raw = {n: {name: [] for name in (*VARIANTS, "simulation")} for n in node_counts}
        walls = {n: {name: [] for name in (*VARIANTS, "simulation")} for n in node_counts}
        device = {n: {name: {"cpu-per-message": [], "run-cpu-per-message": [], "peak-pss": [], "peak-rss": []}
                      for name in VARIANTS} for n in node_counts}  # fmt: skip
        for repeat in range(repeats):
            for n in node_counts:
                for variant in VARIANTS:
                    work = scratch / f"{variant}-{n}-{repeat}"
                    print(f"repeat {repeat + 1}/{repeats}: {n} SuperNodes, {variant}", flush=True)
                    case = deployment_case(app, devices[:n], rounds, work, warm=variant == "warm")
                    raw[n][variant] += case["messages"]
                    walls[n][variant].append(case["run-wall"])
                    per_device = len(case["messages"]) / n
                    for end, start, peak in zip(case["supernode-cpu"], case["before-run-cpu"], case["peak-memory"],
                                                strict=True):  # fmt: skip
                        total = end["supernode"] + end["descendants"]
                        started = start["supernode"] + start["descendants"]
                        device[n][variant]["cpu-per-message"].append(total / per_device)
                        device[n][variant]["run-cpu-per-message"].append((total - started) / per_device)
                        device[n][variant]["peak-pss"].append(peak["pss"])
                        device[n][variant]["peak-rss"].append(peak["rss"])
                    shutil.rmtree(work, ignore_errors=True)
                work = scratch / f"simulation-{n}-{repeat}"
                print(f"repeat {repeat + 1}/{repeats}: {n} clients, simulation", flush=True)
                case = simulation_case(app, merged[n], n, rounds, work)
                raw[n]["simulation"] += case["messages"]
                walls[n]["simulation"].append(case["run-wall"])
                shutil.rmtree(work, ignore_errors=True)
        results = {
            "benchmark": "deploy_cost", "machine": machine(),
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip(),
            "rounds": rounds, "repeats": repeats, "train-images-per-node": TRAIN_PER_CLASS * 10,
            "messages-per-device": rounds + 2, "fab-bytes": fab_bytes(app),
            "cases": {n: {name: summarise(messages) for name, messages in cases.items()} for n, cases in raw.items()},
            "run-wall-seconds": walls, "device": device,
        }  # fmt: skip
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(scratch / "app")],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    write_report(out_dir / "deploy_cost.json", results, table(results) + "\n", stamped=False, indent=1)
    print(table(results))
    print(f"wrote {out_dir / 'deploy_cost.json'}")


if __name__ == "__main__":
    main()
