"""Benchmark B3: asynchronous diffusion against its theory, on least squares with 20 agents.

Every run goes through Flower's simulation engine (a private local SuperLink, one
SuperNode per agent) with the ``diffusion`` strategy on the ``least-squares``
dataset (agents with different true parameters and input distributions), agents'
participation q_k spread over [0.3, 1] (seeded shuffle), q_lk = 0.7, mini-batches
of 20 of each agent's 200 rows (so gradients are noisy), and every agent's model
kept every round (``diffusion-snapshot-every = 1``). From the snapshots:

- MSD_i = 1/K sum_k ||w_k,i - w*||^2 per iteration, for w* = the seed's w_o
  (weights p_k q_k) and for w* = the first-order limit (``limit_weights``);
- steady-state MSD (mean over the second half) for mu and mu/2;
- the network mean's distance to w_o, to the limit and to the plain-average optimum;
- diffusion in ``fedavg`` mode (seed eq. 15) against the ``fedavg`` strategy on the
  same data (test loss per evaluation).

Writes ``bench/results/diffusion_theory.json`` and ``.md`` and ``diffusion_msd.png``;
each finished run's analysis is appended to ``diffusion_theory_runs.jsonl`` and not run
again, so the benchmark resumes where it stopped.

    python bench/diffusion_theory.py --quick     # a few minutes: one graph, T = 1, fewer rounds
    python bench/diffusion_theory.py             # the README's table
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.config import parse_settings  # noqa: E402
from app.launcher import LocalSimulation  # noqa: E402
from bench.common import QUICK_RESULTS, RunLog, machine, read_records  # noqa: E402
from datasets import load_client_data  # noqa: E402
from datasets.least_squares import least_squares_optimum  # noqa: E402

AGENTS, MU, BATCH = 20, 0.1, 20
NETWORKS = (("ring", "metropolis"), ("erdos-renyi", "uniform"))


def participation(seed: int) -> str:
    values = np.random.default_rng(seed).permutation(np.linspace(0.3, 1.0, AGENTS))
    return ",".join(f"{v:.4f}" for v in values)


def base_config(seed: int, rounds: int) -> dict:
    return {
        "strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
        "synthetic-alpha": 1.0, "synthetic-beta": 0.5, "batch-size": BATCH, "seed": seed,
        "num-server-rounds": rounds, "eval-every": max(1, rounds // 10), "diffusion-edge-probability": 0.2,
        "diffusion-participation-per-agent": participation(seed), "diffusion-neighbour-probability": 0.7,
    }  # fmt: skip


def optima(config: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    settings = parse_settings(config)
    parts = [load_client_data(settings.data_spec(AGENTS), settings.partition_spec(AGENTS), k) for k in range(AGENTS)]
    return [p.train_x for p in parts], [p.train_y for p in parts]


def analyse(run_dir: Path, xs: list, ys: list) -> dict:
    """MSD curves and distances of one diffusion run from its snapshots and topology."""
    topology = np.load(run_dir / "topology.npz")
    models = np.load(run_dir / "agents.npz")["models"].astype(np.float64)  # (rounds, K, P)
    targets = {
        "w_o": least_squares_optimum(xs, ys, topology["weights"]),
        "limit": least_squares_optimum(xs, ys, topology["limit_weights"]),
        "plain": least_squares_optimum(xs, ys, np.ones(AGENTS)),
    }
    half = len(models) // 2
    mean = models[half:].mean(axis=(0, 1))
    out = {"msd": {}, "steady-msd": {}, "mean-distance": {}}
    for name, target in targets.items():
        msd = np.mean(np.sum((models - target) ** 2, axis=2), axis=1)
        out["msd"][name] = msd.tolist()
        out["steady-msd"][name] = float(msd[half:].mean())
        out["mean-distance"][name] = float(np.linalg.norm(mean - target))
    out["w_o-to-plain"] = float(np.linalg.norm(targets["w_o"] - targets["plain"]))
    out["w_o-to-limit"] = float(np.linalg.norm(targets["w_o"] - targets["limit"]))
    records, _ = read_records(run_dir)
    out["disagreement-final"] = records[-1]["disagreement"]
    return out


def test_losses(run_dir: Path) -> list[tuple[int, float]]:
    records, _ = read_records(run_dir)
    return [(r["round"], r["loss"]) for r in records if "loss" in r]


def run(sim: LocalSimulation, config: dict, name: str, results: str, federation: str) -> Path:
    config = {**config, "results-dir": results, "run-name": name}
    outcome = sim.run(run_config=config, num_supernodes=AGENTS, extra_federation=federation, timeout_s=1800)
    if not outcome.ok:
        raise SystemExit(f"{name}: {outcome.status}\n{outcome.log_tail}")
    print(f"{name}: {outcome.wall_seconds:.0f} s", flush=True)
    return Path(results) / name


def compare_fedavg(sim: LocalSimulation, base: dict, xs: list, ys: list, results: str, args) -> dict:
    """Diffusion in eq. 15 mode against the fedavg strategy with the same participation and local work."""
    q, t = 0.5, 5
    common = {**base, "diffusion-participation-per-agent": "", "diffusion-participation": q, "local-steps": t,
              "diffusion-mu": MU}  # fmt: skip
    diffusion_dir = run(sim, {**common, "diffusion-mode": "fedavg", "diffusion-snapshot-every": args.rounds},
                        "eq15", results, args.federation)  # fmt: skip
    fedavg_config = {**common, "strategy": "fedavg", "fraction-fit": q, "lr": MU, "adapt-steps": 0,
                     "aggregation": "examples", "min-fit-clients": 1}  # fmt: skip
    fedavg_dir = run(sim, fedavg_config, "fedavg", results, args.federation)
    final = np.load(diffusion_dir / "agents.npz")["models"][-1].astype(np.float64).mean(axis=0)
    plain = least_squares_optimum(xs, ys, np.ones(AGENTS))
    diffusion_losses, fedavg_losses = test_losses(diffusion_dir), test_losses(fedavg_dir)
    return {
        "q": q, "T": t, "mu": MU, "diffusion-losses": diffusion_losses, "fedavg-losses": fedavg_losses,
        "diffusion-loss": diffusion_losses[-1][1], "fedavg-loss": fedavg_losses[-1][1],
        "diffusion-to-plain": float(np.linalg.norm(final - plain)),
    }  # fmt: skip


def markdown(rep: dict) -> str:
    lines = [
        f"K = {AGENTS} agents, least squares (10 parameters), q_k spread over [0.3, 1], q_lk = 0.7, batches of "
        f"{BATCH}; {rep['rounds']} rounds; steady state = mean over the second half; seed {rep['seed']}.",
        "",
        "| graph, rule | T | mu | steady MSD to w_o | steady MSD to limit | MSD ratio mu/(mu/2), limit "
        "| mean to w_o | mean to limit | mean to plain | ‖w_o - plain‖ | ‖w_o - limit‖ |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["diffusion"]:
        a = r["analysis"]
        ratio = f"{r['msd-ratio-limit']:.2f}" if "msd-ratio-limit" in r else ""
        lines.append(
            f"| {r['graph']}, {r['combination']} | {r['T']} | {r['mu']} | {a['steady-msd']['w_o']:.2e} "
            f"| {a['steady-msd']['limit']:.2e} | {ratio} | {a['mean-distance']['w_o']:.3f} "
            f"| {a['mean-distance']['limit']:.3f} | {a['mean-distance']['plain']:.3f} | {a['w_o-to-plain']:.3f} "
            f"| {a['w_o-to-limit']:.3f} |"
        )
    if rep.get("fedavg"):
        f = rep["fedavg"]
        lines += [
            "",
            f"FedAvg as diffusion (eq. 15, q_k = {f['q']}, T = {f['T']}, mu = {f['mu']}) against the `fedavg` strategy "
            f"(fraction-fit {f['q']}, {f['T']} local steps, lr {f['mu']}): final test loss {f['diffusion-loss']:.4f} "
            f"against {f['fedavg-loss']:.4f}; network mean to the plain optimum {f['diffusion-to-plain']:.3f}.",
        ]
    return "\n".join(lines) + "\n"


def plot(rep: dict, curves: dict[int, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, target in zip(axes, ("w_o", "limit"), strict=True):
        for i, r in enumerate(rep["diffusion"]):
            label = f"{r['graph']}/{r['combination']} T={r['T']} mu={r['mu']}"
            ax.semilogy(curves[i][target], label=label, lw=0.8)
        ax.set_title(f"MSD to {'the seed w_o (p_k q_k)' if target == 'w_o' else 'the first-order limit'}")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("1/K sum ||w_k - w*||^2")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ring only, T = 1, 200 rounds, no FedAvg comparison")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--federation", default="client-resources-num-cpus=1")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "diffusion_theory.json")
    args = parser.parse_args()
    networks, steps = (NETWORKS[:1], (1,)) if args.quick else (NETWORKS, (1, 5))
    if args.quick:
        args.rounds = 200
        args.out = QUICK_RESULTS / args.out.name
    started = time.perf_counter()
    base = base_config(args.seed, args.rounds)
    xs, ys = optima(base)
    rep: dict = {"benchmark": "B3", "quick": args.quick, "rounds": args.rounds, "seed": args.seed, "diffusion": []}
    curves: dict[int, dict[str, list[float]]] = {}  # report row -> its MSD curves
    log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=("name", "rounds", "seed"))
    logged = len(log.results)
    with tempfile.TemporaryDirectory() as results, LocalSimulation(app_dir=REPO) as sim:

        def analysed(config: dict, name: str) -> dict:
            """A diffusion run's analysis, recalled from the run log or run now."""
            if (done := log.get({"name": name, "rounds": args.rounds, "seed": args.seed})) is not None:
                return done["analysis"]
            analysis = analyse(run(sim, config, name, results, args.federation), xs, ys)
            log.append({"name": name, "rounds": args.rounds, "seed": args.seed, "analysis": analysis})
            return analysis

        for graph, rule in networks:
            for t in steps:
                steady = {}
                for mu in (MU, MU / 2):
                    config = {**base, "diffusion-graph": graph, "diffusion-combination": rule, "local-steps": t,
                              "diffusion-mu": mu, "diffusion-snapshot-every": 1}  # fmt: skip
                    analysis = analysed(config, f"{graph}-{rule}-T{t}-mu{mu}")
                    steady[mu] = analysis["steady-msd"]["limit"]
                    curves[len(rep["diffusion"])] = analysis["msd"]
                    # the MSD curves stay in the run log; the report keeps the figures
                    summary = {k: v for k, v in analysis.items() if k != "msd"}
                    row = {"graph": graph, "combination": rule, "T": t, "mu": mu, "analysis": summary}
                    if mu == MU / 2:
                        row["msd-ratio-limit"] = steady[MU] / steady[MU / 2]
                    rep["diffusion"].append(row)
        if not args.quick:
            key = {"name": "fedavg-comparison", "rounds": args.rounds, "seed": args.seed}
            if (done := log.get(key)) is None:
                done = {**key, "comparison": compare_fedavg(sim, base, xs, ys, results, args)}
                log.append(done)
            rep["fedavg"] = done["comparison"]
    measured = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "total-seconds": time.perf_counter() - started}
    if len(log.results) == logged and args.out.exists():  # nothing new was run: keep when and where it was measured
        previous = json.loads(args.out.read_text())
        measured = {k: previous.get(k, v) for k, v in measured.items()}
    rep |= measured
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rep))
    plot(rep, curves, args.out.with_name(args.out.stem.replace("diffusion_theory", "diffusion_msd") + ".png"))
    print(markdown(rep))


if __name__ == "__main__":
    main()
