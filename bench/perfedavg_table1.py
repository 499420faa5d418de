"""Benchmark B1: the Per-FedAvg paper's Table 1 at the scale of a 2-core machine.

Runs FedAvg + update and Per-FedAvg FO / HF / SO through Flower's simulation
engine (a private local SuperLink) on ``../shared/data/mnist-10k`` split as in
BENCHMARKS.md B1 (n = 50 users, a = 34, r = 0.2, d = d' = d'' = 40, delta = 1e-3),
for the rows (tau, alpha) and seeds asked, and writes
``bench/results/perfedavg_table1.json`` and ``.md``: per row and method the mean
personalised accuracy over the 50 users (one step of size alpha on a batch of 40 of
their own training images) with a 95% t-interval over seeds, seconds per round and
gradient evaluations per round. It also times one local step of each variant on
the MLP with batches of 40, side by side in this process (medians of interleaved
repeats), and reports hf/fo and so/fo.

    python -m bench.perfedavg_table1 --quick            # one seed, two rows
    python -m bench.perfedavg_table1                    # the README's table
    python -m bench.perfedavg_table1 --choose-beta      # FedAvg grid that fixed beta

Every finished run is appended to ``bench/results/perfedavg_table1_runs.jsonl`` and
skipped when the same run (seed, row, method, rounds, beta) is asked for again, so a
long benchmark can be stopped and resumed; ``--report-only`` rebuilds the tables from
the runs recorded so far.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from app.config import parse_settings
from app.local.simulation import LocalSimulation
from bench.harness import RunLog, arguments, interval, local_simulation, read_records, stamp, write_report
from bench.perfedavg_setup import (
    BATCH,
    DEFAULT_DATA,
    IMAGES_PER_CLASS,
    METHODS,
    NUM_USERS,
    QUICK_ROWS,
    Row,
    run_config,
)
from clients.losses import model_loss
from clients.meta import meta_gradient
from clients.models import build_model
from clients.perfedavg import PerFedAvgClient
from datasets import ClientData

# diff. hetero.: the second half keep only their 34 images of one digit 5-9, and Per-FedAvg refuses
# batches larger than a client's data, so that row runs every method with d = d' = d'' = 34.
ROWS = (Row(10, 0.001), Row(4, 0.001), Row(10, 0.01), Row(4, 0.01), Row(4, 0.05), Row(4, 0.05, "diff-hetero", 34))
COST_KEYS = ("seconds-per-round", "grad-evals-per-round", "hvp-evals-per-round")


def summarise_run(run_dir: Path) -> dict:
    """Final personalised accuracy, and per-round cost from the training-only rounds."""
    rounds, summary = read_records(run_dir)
    final = summary["final"]
    train_only = [r for r in rounds if "accuracy" not in r] or rounds
    return {
        "accuracy": final["accuracy-client-mean"],
        "accuracy-weighted": final["accuracy"],
        "global-accuracy": final["global-accuracy-client-mean"],
        "curve": [(r["round"], r["accuracy-client-mean"]) for r in rounds if "accuracy" in r],
        "seconds-per-round": statistics.median(r["round-seconds"] for r in train_only),
        "grad-evals-per-round": statistics.mean(r["grad-evals"] for r in rounds),
        "hvp-evals-per-round": statistics.mean(r.get("hvp-evals", 0) for r in rounds),
        "failed-replies": sum(r["clients-failed"] for r in rounds),
    }


def run_one(sim: LocalSimulation, config: dict, federation: str) -> dict:
    """Run one configuration on the 50 users; its summary, or exit with the run's log if it failed."""
    outcome = sim.run(run_config=config, num_supernodes=NUM_USERS, extra_federation=federation)
    if not outcome.ok:
        raise SystemExit(f"{config['run-name']}: {outcome.status}\n{outcome.log_tail}")
    return {**summarise_run(Path(config["results-dir"]) / config["run-name"]), "wall-seconds": outcome.wall_seconds}


# a run's identity in the run log, in this order: the logged runs are keyed "seed|row|method|rounds|beta"
KEY_FIELDS = ("seed", "row", "method", "rounds", "beta")


def step_costs(repeats: int = 41, steps: int = 20) -> dict:
    """Wall time per variant of one meta-gradient and of one local step, interleaved; medians.

    A local step is what ``PerFedAvgClient`` does tau times a round: draw D, D', D''
    (40 each), compute the meta-gradient, update the parameters; it is timed through
    the client's own ``local_train`` on 200 random images. The meta-gradient alone
    is timed on fixed batches.
    """
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model("mlp", input_shape=(1, 28, 28), num_classes=10).to(device)
    gen = torch.Generator().manual_seed(0)
    batches = tuple(
        (
            torch.rand(BATCH, 1, 28, 28, generator=gen).to(device),
            torch.randint(0, 10, (BATCH,), generator=gen).to(device),
        )
        for _ in range(3)
    )
    params = tuple(p.detach() for p in model.parameters())
    loss = model_loss(model)
    images = np.random.default_rng(0).integers(0, 256, (200, 1, 28, 28), dtype=np.uint8)
    labels = np.random.default_rng(1).integers(0, 10, 200)
    data = ClientData(train_x=images, train_y=labels, test_x=images[:10], test_y=labels[:10], num_classes=10)
    client = PerFedAvgClient(model=model, data=data, settings=parse_settings({}), partition_id=0)
    variants = ("fo", "hf", "so")
    local = {v: parse_settings({"perfedavg-variant": v, "perfedavg-alpha": 0.01, "perfedavg-beta": 0.01,
                                "local-steps": steps, "batch-size": BATCH, "perfedavg-outer-batch-size": BATCH,
                                "perfedavg-hessian-batch-size": BATCH}) for v in variants}  # fmt: skip
    rng = np.random.default_rng(0)

    def meta(variant: str) -> None:
        for _ in range(steps):
            meta_gradient(loss, params, batches, alpha=0.01, variant=variant)

    def step(variant: str) -> None:
        client.local_train(local[variant].training, local[variant].method, rng)

    times: dict[str, dict[str, list[float]]] = {"meta-gradient": {v: [] for v in variants},
                                                 "local-step": {v: [] for v in variants}}  # fmt: skip
    for repeat in range(repeats + 2):  # the first two are warm-up
        for kind, run in (("meta-gradient", meta), ("local-step", step)):
            for variant in variants:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                run(variant)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if repeat >= 2:
                    times[kind][variant].append((time.perf_counter() - start) / steps)
    out: dict = {"device": device.type, "repeats": repeats, "steps-per-repeat": steps}
    for kind, per_variant in times.items():
        med = {v: statistics.median(t) for v, t in per_variant.items()}
        # ratios within each repeat (measured seconds apart), then their median: robust to drifts in load
        ratios = {f"{v}/fo": statistics.median(a / b for a, b in zip(per_variant[v], per_variant["fo"], strict=True))
                  for v in ("hf", "so")}  # fmt: skip
        out[kind] = {"median-seconds": med, **ratios}
    return out


def markdown(report: dict) -> str:
    lines = [
        f"Mean personalised test accuracy over the {NUM_USERS} users (%, mean ± 95% t-interval over the seeds); "
        f"{report['rounds']} rounds, beta = {report['beta']}.",
        "",
        "| row | " + " | ".join(m[0] for m in METHODS) + " | seeds |",
        "|---|" + "---|" * (len(METHODS) + 1),
    ]
    for row in report["rows"]:
        cells = [f"{100 * c['mean']:.2f} ± {100 * c['ci95']:.2f}" for c in row["methods"].values()]
        seeds = min(len(c["accuracy"]) for c in row["methods"].values())
        cells[-1] += f" | {seeds}"
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Cost per round, median over the seeds (10 clients a round): seconds, and gradient evaluations "
        "(+ Hessian-vector products):",
        "",
        "| row | " + " | ".join(m[0] for m in METHODS) + " |",
        "|---|" + "---|" * len(METHODS),
    ]
    for row in report["rows"]:
        cells = []
        for c in row["methods"].values():
            seconds, grads, hvps = (c[k] for k in COST_KEYS)
            cells.append(f"{seconds:.2f} s, {grads:.0f}" + (f" + {hvps:.0f}" if hvps else ""))
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines.append("")
    for kind, what in (("local-step", "One local step (draw D, D', D'', meta-gradient, update)"),
                       ("meta-gradient", "The meta-gradient alone")):  # fmt: skip
        sc, sec = report["step-cost"][kind], report["step-cost"][kind]["median-seconds"]
        lines.append(
            f"{what} on the MLP, batches of 40 ({report['step-cost']['device']}, medians): fo {1e3 * sec['fo']:.2f} "
            f"ms, hf {1e3 * sec['hf']:.2f} ms ({sc['hf/fo']:.2f}x fo), so {1e3 * sec['so']:.2f} ms "
            f"({sc['so/fo']:.2f}x fo)."
        )
    return "\n".join(lines) + "\n"


def choose_beta(args: argparse.Namespace, grid: tuple[float, ...]) -> None:
    row, out = ROWS[0], {}
    with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
        for beta in grid:
            name = f"beta-{beta}"
            config = run_config(
                row,
                "fedavg",
                "",
                beta=beta,
                rounds=args.rounds,
                seed=0,
                data_dir=args.data_dir,
                results=results,
                name=name,
            )
            out[beta] = run_one(sim, config, args.federation)
            print(f"beta {beta}: accuracy {out[beta]['accuracy']:.4f} curve {out[beta]['curve']}", flush=True)
    path = args.out.with_name("perfedavg_beta_choice.json")
    write_report(path, {"row": row.label, "rounds": args.rounds, "fedavg": out}, stamped=False)
    print(f"wrote {path}")


def main() -> None:
    parser = arguments(__doc__, out="perfedavg_table1.json", quick="one seed, two rows",
                       report_only="tables from the recorded runs, no new runs")  # fmt: skip
    parser.add_argument("--choose-beta", action="store_true", help="FedAvg over a beta grid (row 1, seed 0)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--beta", type=float, default=0.1, help="chosen with --choose-beta (see README)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--federation", default="client-resources-num-cpus=1")
    args = parser.parse_args()
    if not (args.data_dir / "MNIST" / "raw").is_dir():
        raise SystemExit(f"B1 needs MNIST in torchvision's layout under {args.data_dir}/MNIST/raw (see --data-dir)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.choose_beta:
        choose_beta(args, (0.01, 0.03, 0.1))
        return
    rows, seeds = (QUICK_ROWS, args.seeds[:1]) if args.quick else (ROWS, args.seeds)
    # rebuilding the tables from the run log keeps what was measured with the runs: step costs, machine, date
    previous = json.loads(args.out.read_text()) if args.report_only and args.out.exists() else {}
    step_cost = previous.get("step-cost") or step_costs()
    print(f"step cost: {step_cost}", flush=True)
    log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=KEY_FIELDS)
    runs: dict[tuple[int, str], list[dict]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
        for seed in seeds:
            for r, row in enumerate(rows):
                for label, strategy, variant in METHODS:
                    fields = {"seed": seed, "row": row.label, "method": label, "rounds": args.rounds, "beta": args.beta}
                    if (recorded := log.get(fields)) is not None:
                        runs.setdefault((r, label), []).append(recorded)
                        continue
                    if args.report_only:
                        continue
                    name = f"s{seed}-r{r}-{strategy}{variant}"
                    config = run_config(
                        row,
                        strategy,
                        variant,
                        beta=args.beta,
                        rounds=args.rounds,
                        seed=seed,
                        data_dir=args.data_dir,
                        results=results,
                        name=name,
                    )
                    result = {**fields, **run_one(sim, config, args.federation)}
                    log.append(result)
                    runs.setdefault((r, label), []).append(result)
                    print(
                        f"[{time.perf_counter() - started:6.0f} s] seed {seed} {row.label} {label}: "
                        f"acc {result['accuracy']:.4f} ({result['seconds-per-round']:.2f} s/round)",
                        flush=True,
                    )
    report_rows = []
    for r, row in enumerate(rows):
        methods = {}
        if any((r, label) not in runs for label, _, _ in METHODS):
            continue  # not run yet (--report-only on a partial log)
        for label, _, _ in METHODS:
            done = runs[(r, label)]
            mean, half = interval([x["accuracy"] for x in done])
            # the runs themselves (curves, costs) are in the run log; the report keeps the figures
            costs = {k: statistics.median(x[k] for x in done) for k in COST_KEYS}
            methods[label] = {"mean": mean, "ci95": half, "seeds": [x["seed"] for x in done],
                              "accuracy": [x["accuracy"] for x in done], **costs}  # fmt: skip
        report_rows.append(
            {"label": row.label, "tau": row.tau, "alpha": row.alpha, "split": row.variant, "methods": methods}
        )
    cost = {}
    for label, _, _ in METHODS:
        every = [x for r in range(len(rows)) for x in runs.get((r, label), [])]
        if not every:
            continue
        cost[label] = {k: statistics.median(x[k] for x in every) for k in COST_KEYS}
    report = {
        "benchmark": "B1",
        "quick": args.quick,
        "seeds": seeds,
        "rounds": args.rounds,
        "beta": args.beta,
        "users": NUM_USERS,
        "images-per-class": IMAGES_PER_CLASS,
        "batch": BATCH,
        "federation": args.federation,
        **stamp(previous),
        "step-cost": step_cost,
        "rows": report_rows,
        "cost": cost,
        "total-seconds": previous.get("total-seconds", time.perf_counter() - started),
    }
    write_report(args.out, report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
