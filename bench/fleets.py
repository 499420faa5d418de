"""Benchmark B11: lockstep, deadline and buffered rounds over an unequal simulated fleet (issue 70).

100 devices of FEMNIST (natural writers) or CIFAR-10 (Dirichlet(0.1)) run FedAvg or Per-FedAvg
in this process (``app/local/inprocess.py``: real clients and server, Flower's message
encoding), on the virtual clock (docs/fleets.md): step times log-normal with a tenfold
p10-p90 spread, on/off windows, speed independent of the data or tied to it (the slowest
devices hold the highest labels). Per (dataset, method, tie, seed), four paces:

- ``lockstep``: 10 devices a round (fraction-fit 0.1), ``ROUNDS`` rounds, each at most ``DEADLINE_S``
  virtual seconds (a reply later than that is discarded, a device that left costs that long);
- ``deadline``: the same target, 13 sampled, the round closes at the 10th reply;
- ``buffered``: 20 devices at once, an update every 10 replies, ``UPDATES`` updates;
- ``buffered-corrected``: the same with ``bias-correction = "inverse-participation"``.

Recorded per run: the global model's accuracy on the test set after every update
(``central-eval``) with its virtual time, the final personalised accuracy of every device
(one evaluation of all 100 after the last update), the slowest quarter's (by step time),
applied updates, mean staleness and each device's share of the applied replies. The target
is lockstep's final global accuracy (same dataset, method, tie and seed); each pace's time to
it is its first update at or above it, against lockstep's own first.

    python -m bench.fleets --quick                # 1 seed, FEMNIST, FedAvg, 3 rounds: bench/results/quick
    python -m bench.fleets --datasets femnist      # the FEMNIST half
    python -m bench.fleets --report-only          # re-render the .md from the JSON
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

from bench.cifar_setup import CIFAR, CLASSES, INPUT_MEAN, INPUT_STD
from bench.harness import SHARED_DATA, RunLog, arguments, stamp

NAME = "fleets"
DEVICES = 100
ROUNDS, UPDATES = 40, 80
SEEDS = (0, 1, 2)
# every pace gets the same deadline: without one a device that leaves holds a lockstep round 3600 s (measured: one
# departure made seed 0's 40 lockstep rounds take 3797 virtual seconds against seed 1's 167), which no operator keeps
DEADLINE_S = 30.0
DATASETS = {
    "femnist": {"dataset": "femnist", "data-dir": str(SHARED_DATA / "femnist-leaf"), "partitioner": "natural",
                "model": "cnn-small", "lr": 0.1, "batch-size": 16, "adapt-batch-size": 16},
    "cifar10": {"dataset": "imagefolder", "data-dir": str(CIFAR), "classes": CLASSES, "input-shape": "3x32x32",
                "input-mean": INPUT_MEAN, "input-std": INPUT_STD, "test-fraction": 0.25, "partitioner": "dirichlet",
                "dirichlet-concentration": 0.1, "model": "fedavg-cnn", "lr": 0.05, "batch-size": 10},
}  # fmt: skip
# Per-FedAvg: first order (the cheapest), B6's alpha on cnn-small, beta = the shared lr
METHODS = {"fedavg": {}, "perfedavg": {"perfedavg-variant": "fo", "perfedavg-alpha": 0.01, "perfedavg-beta": 0.1}}
PACES = {
    "lockstep": {"pace": "lockstep"},
    "deadline": {"pace": "deadline"},
    "buffered": {"pace": "buffered", "concurrency": 20, "buffer-size": 10},
    "buffered-corrected": {"pace": "buffered", "concurrency": 20, "buffer-size": 10,
                           "bias-correction": "inverse-participation"},
}  # fmt: skip
TIES = ("independent", "data")
COMMON = {"fraction-fit": 0.1, "min-fit-clients": 10, "local-steps": 10, "fraction-evaluate": 1.0,
          "central-eval": True, "aggregation": "examples", "adapt-steps": 1, "fleet-on-seconds": 600.0,
          "fleet-off-seconds": 200.0, "deadline": DEADLINE_S}  # fmt: skip


def one_run(dataset: str, method: str, pace: str, tie: str, seed: int, rounds: int) -> dict:
    """One pace's run; its curve, final personalised accuracies and participation."""
    from app.local.inprocess import served_run  # here: --report-only needs no torch

    updates = rounds if pace in ("lockstep", "deadline") else rounds * UPDATES // ROUNDS
    with tempfile.TemporaryDirectory() as folder:
        config = {**COMMON, **DATASETS[dataset], **METHODS[method], **PACES[pace], "strategy": method, "seed": seed,
                  "fleet-speed-tie": tie, "num-server-rounds": updates, "eval-every": updates,
                  "results-dir": folder, "run-name": "run"}  # fmt: skip
        strategy, grid = served_run(config, num_clients=DEVICES)
        personal, answer = {}, grid.client_app

        def recording(message, context):  # every device's own accuracy in the final evaluation
            reply = answer(message, context)
            if message.metadata.message_type == "evaluate" and reply.has_content():
                personal[int(context.node_config["partition-id"])] = float(
                    reply.content.metric_records["metrics"]["accuracy"])
            return reply

        grid.client_app = recording
        started = time.perf_counter()
        strategy.start(grid=grid)
        wall = time.perf_counter() - started
        history, pacer = strategy.method.history, strategy.method.phases.pacer
        steps = pacer.model.step_seconds
    slowest = sorted(steps, key=lambda p: -steps[p])[: DEVICES // 4]
    shares = pacer.participation.shares() if pace.startswith("buffered") else _round_shares(history)
    return {"dataset": dataset, "method": method, "pace": pace, "tie": tie, "seed": seed, "wall-seconds": wall,
            "curve": [(r["virtual-seconds"], r.get("central-accuracy")) for r in history],
            "updates": len(history), "final-global": history[-1].get("central-accuracy"),
            "final-personal": statistics.mean(personal.values()) if personal else None,
            "slow-quarter-personal": (statistics.mean(personal[p] for p in slowest if p in personal)
                                      if personal else None),
            "staleness": statistics.mean(r.get("staleness-mean", 0.0) for r in history),
            "left": sum(r.get("clients-left", 0) for r in history),
            "late": sum(r.get("clients-late", 0) for r in history),
            "slow-quarter-share": sum(shares.get(p, 0.0) for p in slowest)}  # fmt: skip


def _round_shares(history: list[dict]) -> dict[int, float]:
    counts: dict[int, int] = {}
    for record in history:  # a round's replies that counted: those sampled, less the late and the departed
        dropped = {*record.get("late-partitions", []), *record.get("left-partitions", [])}
        for partition in set(record.get("fit-partitions", [])) - dropped:
            counts[partition] = counts.get(partition, 0) + 1
    total = sum(counts.values()) or 1
    return {p: c / total for p, c in counts.items()}


def first_time(curve: list, target: float) -> float | None:
    """The virtual time of the first update whose global accuracy is at least ``target``."""
    return next((t for t, accuracy in curve if accuracy is not None and accuracy >= target), None)


def compare(runs: list[dict]) -> list[dict]:
    """Each run beside its lockstep run: the time to lockstep's final accuracy, as a ratio."""
    lockstep = {(r["dataset"], r["method"], r["tie"], r["seed"]): r for r in runs if r["pace"] == "lockstep"}
    rows = []
    for run in runs:
        base = lockstep.get((run["dataset"], run["method"], run["tie"], run["seed"]))
        if base is None:
            continue
        target = base["final-global"]
        mine, theirs = first_time(run["curve"], target), first_time(base["curve"], target)
        rows.append({**{k: v for k, v in run.items() if k != "curve"}, "target": target, "time-to-target": mine,
                     "lockstep-time-to-target": theirs,
                     "time-ratio": mine / theirs if mine is not None and theirs else None,
                     "slow-quarter-gap": (run["slow-quarter-personal"] - base["slow-quarter-personal"]
                                          if run["slow-quarter-personal"] is not None else None)})  # fmt: skip
    return rows


def markdown(rows: list[dict], report: dict) -> str:
    lines = ["# B11: unequal fleets, lockstep against deadline against buffered", "",
             f"{report['machine']}, {report['date']}; {DEVICES} devices on the virtual clock (docs/fleets.md); "
             "each cell the mean over seeds (n), the time ratio against lockstep's time to its own final global "
             "accuracy (lower is faster; 'never' = not reached).", "",
             "| dataset | method | tie | pace | n | time ratio | updates | global | personalised | slow quarter "
             "(gap to lockstep) | slow quarter's share | staleness | left |", "|---" * 13 + "|"]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["method"], row["tie"], row["pace"]), []).append(row)
    order = sorted(groups.items(), key=lambda kv: (kv[0][:3], list(PACES).index(kv[0][3])))
    for (dataset, method, tie, pace), cell in order:
        ratios = [r["time-ratio"] for r in cell if r["time-ratio"] is not None]
        ratio = f"{statistics.median(ratios):.2f} ({len(ratios)}/{len(cell)} reached)" if ratios else "never"

        def mean(key: str, cell=cell) -> str:
            values = [r[key] for r in cell if r[key] is not None]
            return f"{statistics.mean(values):.3f}" if values else "-"

        lines.append(f"| {dataset} | {method} | {tie} | {pace} | {len(cell)} | {ratio} | {mean('updates')} | "
                     f"{mean('final-global')} | {mean('final-personal')} | {mean('slow-quarter-personal')} "
                     f"({mean('slow-quarter-gap')}) | {mean('slow-quarter-share')} | {mean('staleness')} | "
                     f"{mean('left')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = arguments(__doc__, out=f"{NAME}.json", quick="seed 0, FEMNIST, FedAvg, independent speeds, 3 rounds",
                       report_only=True)  # fmt: skip
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--ties", nargs="+", default=list(TIES), choices=list(TIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if args.quick:
        args.datasets, args.methods, args.ties, args.seeds = ["femnist"], ["fedavg"], ["independent"], [0]
        args.rounds = 3
    log = RunLog(path=args.out.with_suffix(".runs.jsonl"), key_fields=("dataset", "method", "tie", "seed", "pace",
                                                                        "rounds"))  # fmt: skip
    if not args.report_only:
        for dataset in args.datasets:
            for method in args.methods:
                for tie in args.ties:
                    for seed in args.seeds:
                        for pace in PACES:
                            fields = {"dataset": dataset, "method": method, "tie": tie, "seed": seed, "pace": pace,
                                      "rounds": args.rounds}  # fmt: skip
                            if log.get(fields) is None:
                                log.append({**one_run(dataset, method, pace, tie, seed, args.rounds),
                                            "rounds": args.rounds})  # fmt: skip
                                print(json.dumps({k: v for k, v in log.get(fields).items() if k != "curve"}),
                                      flush=True)  # fmt: skip
    runs = [r for r in log.results.values() if r.get("rounds") == args.rounds]
    report = {"benchmark": "B11", **stamp(), "rows": compare(runs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report["rows"], report))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
