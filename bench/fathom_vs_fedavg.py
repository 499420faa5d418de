"""Benchmark B2: FATHOM against grid-tuned static FedAvg on LEAF FEMNIST (105 writers).

Every run goes through Flower's simulation engine (a private local SuperLink) with
one SuperNode per writer (natural split, the writers' own train/test files), 10
clients a round, the ``cnn-small`` model, and the global model tested after every
round on the server on all 105 writers' test data pooled (``central-eval``: the
same figure as the example-weighted federated accuracy without adaptation, at a
fraction of the cost of asking 105 clients).

1. FedAvg grid (seed 0, epochs 1): client lr x batch size; the setting with the
   highest plateau (mean test accuracy over the last 10 rounds) is the tuned baseline.
2. For each seed: FedAvg and FATHOM from the baseline start (the tuned lr and batch,
   epochs 1), and from the paper's bad starts, lr 0.01 and batch 256.
3. Target = 95% of the tuned FedAvg's plateau (mean over seeds). For every run, the
   rounds to reach it (first round at or above it) and the per-example gradients
   computed until then; means and 95% t-intervals over the seeds that reached it.

Writes ``bench/results/fathom_vs_fedavg.json`` and ``.md`` and
``fathom_trajectories.png`` (accuracy, lr, epochs and batch size per round).

    python bench/fathom_vs_fedavg.py --quick     # a few minutes: one seed, short, no grid
    python bench/fathom_vs_fedavg.py             # the README's table (under an hour on 2 cores)

Finished runs are appended to ``bench/results/fathom_vs_fedavg_runs.jsonl`` and not
run again when asked for with the same settings, so the benchmark resumes;
``--report-only`` rebuilds the report from that log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.launcher import LocalSimulation  # noqa: E402
from bench.common import QUICK_RESULTS, SHARED_DATA, RunLog, interval, machine, read_records  # noqa: E402

WRITERS, PER_ROUND, MODEL = 105, 10, "cnn-small"
GRID_LR, GRID_BATCH = (0.03, 0.1, 0.3), (16, 64)
BAD_LR, BAD_BATCH = 0.01, 256
TARGET_SHARE = 0.95
PLATEAU_ROUNDS = 10
METHODS = ("fedavg", "fathom")
KEY_FIELDS = ("method", "lr", "batch", "seed", "rounds")


@dataclass(frozen=True)
class Start:
    """A starting point: its label and the (lr, batch size) it starts from (epochs 1)."""

    label: str
    lr: float
    batch: int


def run_config(method: str, start: Start, *, seed: int, rounds: int, data_dir: Path) -> dict:
    return {
        "strategy": method,
        "dataset": "femnist",
        "data-dir": str(data_dir),
        "partitioner": "natural",
        "model": MODEL,
        "seed": seed,
        "num-server-rounds": rounds,
        "eval-every": rounds,  # federated evaluation once, at the end; the curve comes from central-eval
        "central-eval": True,
        "fraction-fit": (PER_ROUND + 0.5) / WRITERS,  # Flower samples int(fraction * available) clients
        "min-fit-clients": PER_ROUND,
        "fraction-evaluate": 1.0,
        "aggregation": "examples",
        "lr": start.lr,
        "batch-size": start.batch,
        "local-epochs": 1.0,
        "adapt-steps": 0,
    }


def summarise(records: list[dict]) -> dict:
    """Accuracy curve, cumulative per-example gradients and FATHOM's trajectory of one run."""
    grads, cumulative = 0, []
    for r in records:
        grads += r["sample-grads"]
        cumulative.append(grads)
    pairs = zip(records, cumulative, strict=True)
    evaluated = [(r["round"], r["central-accuracy"], g) for r, g in pairs]
    hyper = [key for key in ("lr", "local-epochs", "batch-size") if f"hp-{key}" in records[0]]
    return {
        "curve": [(t, a) for t, a, _ in evaluated],
        "grads-at-eval": [g for _, _, g in evaluated],
        "plateau": statistics.mean(a for _, a, _ in evaluated[-PLATEAU_ROUNDS:]),
        "final-accuracy": evaluated[-1][1],
        "seconds-per-round": statistics.median(
            r["round-seconds"] for r in [r for r in records if "accuracy" not in r] or records
        ),
        "trajectory": {key: [r[f"hp-{key}"] for r in records] for key in hyper},
    }


def to_target(result: dict, target: float) -> tuple[int | None, int | None]:
    """Rounds and per-example gradients until the first evaluation at or above ``target``."""
    for (t, acc), grads in zip(result["curve"], result["grads-at-eval"], strict=True):
        if acc >= target:
            return t, grads
    return None, None


class Bench:
    """Runs (or recalls) B2's runs through one local SuperLink."""

    def __init__(self, *, args: argparse.Namespace, sim: LocalSimulation | None, results_dir: str) -> None:
        self.args, self.sim, self.results_dir = args, sim, results_dir
        self.log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=KEY_FIELDS)
        self.started = time.perf_counter()

    def run(self, method: str, start: Start, seed: int) -> dict | None:
        fields = {"method": method, "lr": start.lr, "batch": start.batch, "seed": seed, "rounds": self.args.rounds}
        if (done := self.log.get(fields)) is not None:
            return done
        if self.sim is None:
            return None  # --report-only
        name = f"{method}-lr{start.lr}-b{start.batch}-s{seed}"
        config = run_config(method, start, seed=seed, rounds=self.args.rounds, data_dir=self.args.data_dir)
        config |= {"results-dir": self.results_dir, "run-name": name}
        outcome = self.sim.run(run_config=config, num_supernodes=WRITERS, extra_federation=self.args.federation)
        if not outcome.ok:
            raise SystemExit(f"{name}: {outcome.status}\n{outcome.log_tail}")
        records, _ = read_records(Path(self.results_dir) / name)
        result = {**fields, **summarise(records), "wall-seconds": outcome.wall_seconds}
        self.log.append(result)
        print(
            f"[{time.perf_counter() - self.started:6.0f} s] {name}: plateau {result['plateau']:.4f}, "
            f"{result['seconds-per-round']:.2f} s/round, run {outcome.wall_seconds:.0f} s",
            flush=True,
        )
        return result


def tune(bench: Bench, seed: int) -> tuple[Start, list[dict]]:
    """The FedAvg grid on one seed; the start with the highest plateau."""
    grid = []
    for lr in GRID_LR:
        for batch in GRID_BATCH:
            result = bench.run("fedavg", Start("grid", lr, batch), seed)
            if result is not None:
                grid.append(result)
    if len(grid) < len(GRID_LR) * len(GRID_BATCH):
        raise SystemExit("the FedAvg grid has not been run yet (run without --report-only first)")
    best = max(grid, key=lambda r: r["plateau"])
    return Start("baseline", best["lr"], best["batch"]), grid


def cell(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    mean, half = interval(values)
    return f"{mean:{fmt}} ± {half:{fmt}}" if len(values) > 1 else f"{mean:{fmt}}"


def report(bench: Bench, starts: list[Start], seeds: list[int], grid: list[dict]) -> tuple[dict, dict]:
    """The report (figures, and the keys of the runs in the run log) and the runs themselves, by start and method."""
    runs = {(s.label, m): [r for seed in seeds if (r := bench.run(m, s, seed))] for s in starts for m in METHODS}
    tuned = runs[("baseline", "fedavg")]
    plateau = statistics.mean(r["plateau"] for r in tuned)
    target = TARGET_SHARE * plateau
    rows = []
    for (label, method), results in runs.items():
        reached = [to_target(r, target) for r in results]
        hits = [(t, g) for t, g in reached if t is not None]
        rows.append({
            "start": label, "method": method, "lr0": results[0]["lr"], "batch0": results[0]["batch"],
            "seeds": len(results), "reached": len(hits),
            "rounds-to-target": [t for t, _ in hits], "grads-to-target": [g for _, g in hits],
            "final-accuracy": [r["final-accuracy"] for r in results],
            "seconds-per-round": statistics.median(r["seconds-per-round"] for r in results),
        })  # fmt: skip
    ratios = {}
    base = {r["method"]: r for r in rows if r["start"] == "baseline"}
    if base["fedavg"]["reached"] and base["fathom"]["reached"]:
        for key in ("rounds-to-target", "grads-to-target"):
            ratios[key] = statistics.mean(base["fathom"][key]) / statistics.mean(base["fedavg"][key])
    rep = {
        "benchmark": "B2",
        "quick": bench.args.quick,
        "seeds": seeds,
        "rounds": bench.args.rounds,
        "model": MODEL,
        "writers": WRITERS,
        "clients-per-round": PER_ROUND,
        "grid": {
            "lr": GRID_LR,
            "batch": GRID_BATCH,
            "epochs": 1,
            "plateaus": [{"lr": r["lr"], "batch": r["batch"], "plateau": r["plateau"]} for r in grid],
        },
        "baseline": {"lr": starts[0].lr, "batch": starts[0].batch},
        "tuned-plateau": plateau,
        "target": target,
        "rows": rows,
        "fathom/fedavg at baseline": ratios,
        "federation": bench.args.federation,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        # the runs themselves (curves, trajectories) are in the run log; the report names them
        "runs": {f"{label}|{method}": [bench.log.key(r) for r in results] for (label, method), results in runs.items()},
    }
    return rep, {f"{label}|{method}": results for (label, method), results in runs.items()}


def markdown(rep: dict) -> str:
    lines = [
        f"Target {rep['target']:.4f} = {TARGET_SHARE:.0%} of tuned FedAvg's plateau {rep['tuned-plateau']:.4f} "
        f"(lr {rep['baseline']['lr']}, batch {rep['baseline']['batch']}, 1 epoch); {rep['rounds']} rounds, "
        "tested after every round; mean ± 95% interval over the seeds that reached the target.",
        "",
        "| start (lr0, batch0) | method | reached | rounds to target | per-example gradients to target "
        "| final accuracy | s/round |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rep["rows"]:
        lines.append(
            f"| {r['start']} ({r['lr0']}, {r['batch0']}) | {r['method']} | {r['reached']}/{r['seeds']} "
            f"| {cell(r['rounds-to-target'], '.0f')} | {cell(r['grads-to-target'], ',.0f')} "
            f"| {cell(r['final-accuracy'], '.4f')} | {r['seconds-per-round']:.2f} |"
        )
    if rep["fathom/fedavg at baseline"]:
        ratio = rep["fathom/fedavg at baseline"]
        lines += [
            "",
            f"FATHOM / FedAvg from the baseline start: rounds {ratio['rounds-to-target']:.2f}x, per-example "
            f"gradients {ratio['grads-to-target']:.2f}x (paper: about 0.67x and 0.68x).",
        ]
    if rep["grid"]["plateaus"]:
        grid = ", ".join(f"({g['lr']}, {g['batch']}) {g['plateau']:.4f}" for g in rep["grid"]["plateaus"])
        lines += ["", f"FedAvg grid (lr, batch) -> plateau, seed {rep['seeds'][0]}: {grid}."]
    return "\n".join(lines) + "\n"


def plot(rep: dict, runs: dict[str, list[dict]], path: Path) -> None:
    """Accuracy and FATHOM's lr, epochs and batch size per round, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    colours = {"baseline": "tab:blue", "bad lr": "tab:orange", "bad batch": "tab:green"}
    for key, results in runs.items():
        label, method = key.split("|")
        style = "-" if method == "fathom" else ":"
        for i, r in enumerate(results):
            name = f"{method}, {label}" if i == 0 else None
            axes[0].plot(*zip(*r["curve"], strict=True), style, color=colours[label], label=name, alpha=0.8)
            for ax, hp in zip(axes[1:], ("lr", "local-epochs", "batch-size"), strict=True):
                if method == "fathom":  # FedAvg's values are its constant settings
                    ax.plot(range(1, len(r["trajectory"][hp]) + 1), r["trajectory"][hp], color=colours[label],
                            label=f"{label}" if i == 0 else None, alpha=0.8)  # fmt: skip
    axes[0].axhline(rep["target"], color="grey", lw=0.8)
    titles = ("test accuracy (FedAvg dotted)", "FATHOM lr", "FATHOM epochs", "FATHOM batch size")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[3].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 30 rounds, no grid (lr 0.1, batch 16)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--report-only", action="store_true", help="the report from the recorded runs, no new runs")
    parser.add_argument("--data-dir", type=Path, default=SHARED_DATA / "femnist-leaf")
    parser.add_argument("--federation", default="client-resources-num-cpus=1")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fathom_vs_fedavg.json")
    args = parser.parse_args()
    if not (args.data_dir / "train").is_dir():
        raise SystemExit(f"B2 needs LEAF FEMNIST (train/ and test/ json) under {args.data_dir} (see --data-dir)")
    if args.quick:
        args.seeds, args.rounds = args.seeds[:1], 30
        args.out = QUICK_RESULTS / args.out.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as results_dir:
        sim = None if args.report_only else LocalSimulation(app_dir=REPO)
        try:
            bench = Bench(args=args, sim=sim, results_dir=results_dir)
            if args.quick:
                baseline, grid = Start("baseline", 0.1, 16), []
            else:
                baseline, grid = tune(bench, args.seeds[0])
            starts = [baseline, Start("bad lr", BAD_LR, baseline.batch), Start("bad batch", baseline.lr, BAD_BATCH)]
            rep, runs = report(bench, starts, args.seeds, grid)
        finally:
            if sim is not None:
                sim.close()
    args.out.write_text(json.dumps(rep, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rep))
    plot(rep, runs, args.out.with_name(args.out.stem.replace("fathom_vs_fedavg", "fathom_trajectories") + ".png"))
    print(markdown(rep))


if __name__ == "__main__":
    main()
