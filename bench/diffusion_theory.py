"""Benchmark B3: where asynchronous diffusion converges, and its MSD, against mu (least squares, 20 agents).

The long runs drive the real ``Diffusion`` strategy and ``DiffusionClient`` classes in
one process through Flower's Strategy API (``app/local/inprocess.py``), on the
``least-squares`` dataset (agents with different true parameters and input
distributions, batches of 20 of each agent's 200 rows), q_k spread over [0.3, 1]
(a seeded shuffle), q_lk = 0.7:

- graphs: ring / Metropolis, Erdos-Renyi (edge probability 0.2) / uniform, star / uniform;
- T in {1, 5}; mu in {0.04, 0.02, 0.01, 0.005}; seeds 0-4 (each seed draws the data,
  the Erdos-Renyi graph, the q_k and every sample);
- iterations: a burn-in of 7 time constants, then a steady-state window of 10, where
  tau = max(1 / (mu T lambda_min), 1 / (1 - |lambda_2(A_bar)|)): lambda_min is the
  smallest eigenvalue of the limit's weighted Hessian sum_l pi_l H_l (unnormalised
  drift weights, see docs/methods/diffusion-limit.md) and lambda_2 the combination's
  second eigenvalue (its consensus time);
- over the window: the time-averaged network mean (1/K sum_k w_k) and its distance to
  the limit optimum (``limit_weights``), to the seed's w_o (p_k q_k) and to the plain
  optimum; the MSD to the limit, (1/K) sum_k ||w_k - w_lim||^2, averaged.

Per (graph, T): log-log slopes against mu, fitted per seed, with 95% t-intervals over
the seeds. A check runs ``flwr run`` once per graph (T = 1, mu = 0.02, 30 rounds,
every agent's model kept every round) and compares every agent's iterates with the
in-process driver's for the same seed. FedAvg-as-diffusion (seed eq. 15) is compared
with the ``fedavg`` strategy through Flower, as before.

Writes ``bench/results/diffusion_theory.json`` and ``.md``, ``diffusion_limit.png``
(distances and MSD against mu) and ``diffusion_msd.png`` (MSD per iteration); each run's
analysis is appended to ``diffusion_theory_runs.jsonl`` and not run again.

    python -m bench.diffusion_theory --quick     # a few minutes: ring, T = 1, two mu, two seeds
    python -m bench.diffusion_theory             # the README's figures (about 40 minutes on 2 cores)
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

from app.config import parse_settings
from app.local.inprocess import InProcessRun
from app.local.simulation import LocalSimulation
from bench.harness import RunLog, arguments, interval, local_simulation, read_records, stamp, write_report
from datasets import load_client_data
from datasets.least_squares import least_squares_optimum
from strategies.methods.topology import Network, build_network, expected_matrix, perron_vector

AGENTS, BATCH = 20, 20
NETWORKS = (("ring", "metropolis"), ("erdos-renyi", "uniform"), ("star", "uniform"))
MUS = (0.04, 0.02, 0.01, 0.005)
STEPS = (1, 5)
SEEDS = (0, 1, 2, 3, 4)
BURN_IN, WINDOW = 7.0, 10.0  # in time constants
EXTRA_HALVINGS = 4  # further halvings of mu for a configuration not yet within half the gap
CURVE_POINTS = 200
CHECK_ROUNDS, CHECK_MU = 30, 0.02
FEDAVG_MU, FEDAVG_ROUNDS = 0.1, 300
KEY_FIELDS = ("graph", "T", "mu", "seed", "burn-in", "window")


def participation(seed: int) -> str:
    values = np.random.default_rng(seed).permutation(np.linspace(0.3, 1.0, AGENTS))
    return ",".join(f"{v:.4f}" for v in values)


def base_config(seed: int, rounds: int) -> dict:
    return {
        "strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
        "synthetic-alpha": 1.0, "synthetic-beta": 0.5, "batch-size": BATCH, "seed": seed,
        "num-server-rounds": rounds, "eval-every": rounds, "diffusion-edge-probability": 0.2,
        "diffusion-participation-per-agent": participation(seed), "diffusion-neighbour-probability": 0.7,
    }  # fmt: skip


def run_config(graph: str, rule: str, t: int, mu: float, seed: int, rounds: int) -> dict:
    return base_config(seed, rounds) | {"diffusion-graph": graph, "diffusion-combination": rule, "local-steps": t,
                                        "diffusion-mu": mu}  # fmt: skip


def agents_data(config: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    settings = parse_settings(config)
    parts = [load_client_data(settings.data_spec(AGENTS), settings.partition_spec(AGENTS), k) for k in range(AGENTS)]
    return [p.train_x.astype(np.float64) for p in parts], [p.train_y.astype(np.float64) for p in parts]


def drift_weights(network: Network) -> np.ndarray:
    """Unnormalised weights of the mean's drift, p_l q_l (1 - (1 - q_l) s_l) (``limit_weights`` before scaling)."""
    kept = network.matrix * network.neighbour_q
    np.fill_diagonal(kept, 0.0)
    p = perron_vector(network.expected)
    return p * network.participation * (1.0 - (1.0 - network.participation) * kept.sum(axis=0))


def time_constant(network: Network, xs: list[np.ndarray], mu: float, t: int) -> float:
    """Iterations for the slower of the mean's descent and the network's consensus to shrink by e."""
    hessian = sum(w * x.T @ x / len(x) for w, x in zip(drift_weights(network), xs, strict=True))
    descent = 1.0 / (mu * t * float(np.linalg.eigvalsh(hessian)[0]))
    second = np.sort(np.abs(np.linalg.eigvals(expected_matrix(network.matrix, network.participation,
                                                              network.neighbour_q))))[-2]  # fmt: skip
    return max(descent, 1.0 / (1.0 - float(second)))


def targets(network: Network, xs: list, ys: list) -> dict[str, np.ndarray]:
    return {
        "limit": least_squares_optimum(xs, ys, network.limit_weights),
        "w_o": least_squares_optimum(xs, ys, network.weights),
        "plain": least_squares_optimum(xs, ys, np.ones(len(xs))),
    }


def limit_run(graph: str, rule: str, t: int, mu: float, seed: int) -> dict:
    """One long in-process run and its analysis over the steady-state window."""
    started = time.perf_counter()
    probe = run_config(graph, rule, t, mu, seed, 1)
    xs, ys = agents_data(probe)
    network = build_network(parse_settings(probe).method, AGENTS, seed=seed)  # as Diffusion.start builds it
    tau = time_constant(network, xs, mu, t)
    burn, window = math.ceil(BURN_IN * tau), math.ceil(WINDOW * tau)
    rounds = burn + window
    run = InProcessRun(run_config=run_config(graph, rule, t, mu, seed, rounds), num_clients=AGENTS)
    goal = targets(run.strategy.network, xs, ys)
    halves = [np.zeros_like(goal["limit"]), np.zeros_like(goal["limit"])]  # the window's two halves
    msd_sum = {name: 0.0 for name in goal}
    every, curve = max(1, rounds // CURVE_POINTS), []

    def after(i: int, strategy) -> None:
        agents = strategy.agents.astype(np.float64)
        msd = {name: float(np.mean(np.sum((agents - w) ** 2, axis=1))) for name, w in goal.items()}
        if i % every == 0:
            curve.append((i, msd["limit"], msd["w_o"]))
        if i > burn:
            halves[i > burn + window // 2] += agents.mean(axis=0)
            for name, value in msd.items():
                msd_sum[name] += value

    run.run(rounds, after)
    mean = (halves[0] + halves[1]) / window
    split = halves[0] / (window // 2) - halves[1] / (window - window // 2)
    return {
        "graph": graph, "combination": rule, "T": t, "mu": mu, "seed": seed, "burn-in": BURN_IN, "window": WINDOW,
        "tau": tau, "rounds": rounds, "window-rounds": [burn + 1, rounds],
        "distance": {name: float(np.linalg.norm(mean - w)) for name, w in goal.items()},
        "steady-msd": {name: value / window for name, value in msd_sum.items()},
        # half the distance between the two halves' means: about the noise left in the averaged mean
        "half-split": float(np.linalg.norm(split)) / 2,
        "w_o-to-limit": float(np.linalg.norm(goal["w_o"] - goal["limit"])),
        "w_o-to-plain": float(np.linalg.norm(goal["w_o"] - goal["plain"])),
        "limit-to-plain": float(np.linalg.norm(goal["limit"] - goal["plain"])),
        "curve": curve, "seconds": time.perf_counter() - started,
    }  # fmt: skip


def slope(mus: list[float], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(mu)."""
    return float(np.polyfit(np.log(mus), np.log(values), 1)[0])


def fitted(values: list[float]) -> dict:
    mean, half = interval(values)
    return {"slope": mean, "low": mean - half, "high": mean + half, "per-seed": values}


def summarise(results: list[dict], seeds: tuple[int, ...]) -> dict:
    """Per (graph, T): distances and MSD against mu with intervals, fitted slopes, and the issue's criteria."""
    groups = []
    for graph, rule in {(r["graph"], r["combination"]) for r in results}:
        for t in sorted({r["T"] for r in results if r["graph"] == graph}):
            runs = {(r["mu"], r["seed"]): r for r in results if r["graph"] == graph and r["T"] == t}
            mus = tuple(sorted({mu for mu, _ in runs}, reverse=True))
            rows = []
            for mu in mus:
                at = [runs[(mu, s)] for s in seeds if (mu, s) in runs]
                if not at:
                    continue
                row = {"mu": mu, "seeds": len(at), "rounds": [r["rounds"] for r in at]}
                for name in ("limit", "w_o", "plain"):
                    row[f"to-{name}"] = interval([r["distance"][name] for r in at])
                row["msd-limit"] = interval([r["steady-msd"]["limit"] for r in at])
                row["w_o-to-limit"] = interval([r["w_o-to-limit"] for r in at])
                row["half-split"] = interval([r["half-split"] for r in at])
                rows.append(row)
            complete = [s for s in seeds if all((mu, s) in runs for mu in mus)]
            slopes = {}
            for name in ("limit", "w_o", "plain"):
                slopes[f"to-{name}"] = fitted([slope(mus, [runs[(mu, s)]["distance"][name] for mu in mus])
                                               for s in complete])  # fmt: skip
            slopes["msd-limit"] = fitted([slope(mus, [runs[(mu, s)]["steady-msd"]["limit"] for mu in mus])
                                          for s in complete])  # fmt: skip
            smallest = [runs[(mus[-1], s)] for s in complete]
            nearer = [r["distance"]["limit"] < 0.5 * r["w_o-to-limit"] for r in smallest]
            groups.append({
                "graph": graph, "combination": rule, "T": t, "seeds": complete, "mus": list(mus),
                "smallest-mu": mus[-1], "rows": rows, "slopes": slopes,
                "criteria": {
                    "w_o-differs-from-limit": all(r["w_o-to-limit"] > 1e-6 for r in smallest),
                    "nearer-limit-than-half-gap-at-smallest-mu": f"{sum(nearer)}/{len(nearer)} seeds",
                    "nearer-limit-than-half-gap-all-seeds": all(nearer),
                    "distance-to-limit-falls-with-mu": slopes["to-limit"]["low"] > 0,
                },
            })  # fmt: skip
    order = {g: i for i, g in enumerate(g for g, _ in NETWORKS)}
    return {"groups": sorted(groups, key=lambda g: (order[g["graph"]], g["T"]))}


# --------------------------------------------------------------- through Flower


def flower_run(sim: LocalSimulation, config: dict, name: str, results: str, federation: str) -> Path:
    config = {**config, "results-dir": results, "run-name": name}
    outcome = sim.run(run_config=config, num_supernodes=AGENTS, extra_federation=federation, timeout_s=1800)
    if not outcome.ok:
        raise SystemExit(f"{name}: {outcome.status}\n{outcome.log_tail}")
    print(f"{name}: flwr run {outcome.wall_seconds:.0f} s", flush=True)
    return Path(results) / name


def flower_check(sim: LocalSimulation, graph: str, rule: str, results: str, federation: str) -> dict:
    """Every agent's iterates from ``flwr run`` against the in-process driver's, same seed, every round."""
    config = run_config(graph, rule, 1, CHECK_MU, 0, CHECK_ROUNDS) | {"diffusion-snapshot-every": 1}
    flower = np.load(flower_run(sim, config, f"check-{graph}", results, federation) / "agents.npz")["models"]
    local = []
    InProcessRun(run_config=config, num_clients=AGENTS).run(CHECK_ROUNDS, lambda i, s: local.append(s.agents.copy()))
    local = np.stack(local)
    return {
        "graph": graph, "combination": rule, "rounds": CHECK_ROUNDS, "mu": CHECK_MU, "T": 1, "seed": 0,
        "max-abs-difference": float(np.max(np.abs(flower.astype(np.float64) - local))),
        "identical": bool(np.array_equal(flower, local)), "scale": float(np.max(np.abs(local))),
    }  # fmt: skip


def compare_fedavg(sim: LocalSimulation, results: str, federation: str) -> dict:
    """Diffusion in eq. 15 mode against the fedavg strategy with the same participation and local work."""
    q, t = 0.5, 5
    common = {**base_config(0, FEDAVG_ROUNDS), "eval-every": FEDAVG_ROUNDS // 10,
              "diffusion-participation-per-agent": "", "diffusion-participation": q, "local-steps": t,
              "diffusion-mu": FEDAVG_MU}  # fmt: skip
    diffusion_dir = flower_run(sim, {**common, "diffusion-mode": "fedavg", "diffusion-snapshot-every": FEDAVG_ROUNDS},
                               "eq15", results, federation)  # fmt: skip
    fedavg_config = {**common, "strategy": "fedavg", "fraction-fit": q, "lr": FEDAVG_MU, "adapt-steps": 0,
                     "aggregation": "examples", "min-fit-clients": 1}  # fmt: skip
    fedavg_dir = flower_run(sim, fedavg_config, "fedavg", results, federation)
    xs, ys = agents_data(common)
    final = np.load(diffusion_dir / "agents.npz")["models"][-1].astype(np.float64).mean(axis=0)
    losses = {name: [(r["round"], r["loss"]) for r in read_records(path)[0] if "loss" in r]
              for name, path in (("diffusion", diffusion_dir), ("fedavg", fedavg_dir))}  # fmt: skip
    return {
        "q": q, "T": t, "mu": FEDAVG_MU, "rounds": FEDAVG_ROUNDS, "diffusion-losses": losses["diffusion"],
        "fedavg-losses": losses["fedavg"], "diffusion-loss": losses["diffusion"][-1][1],
        "fedavg-loss": losses["fedavg"][-1][1],
        "diffusion-to-plain": float(np.linalg.norm(final - least_squares_optimum(xs, ys, np.ones(AGENTS)))),
    }  # fmt: skip


# --------------------------------------------------------------- report


def _ci(pair: tuple[float, float], fmt: str) -> str:
    return f"{pair[0]:{fmt}} ± {pair[1]:{fmt}}"


def markdown(rep: dict) -> str:
    lines = [
        f"K = {AGENTS} agents, least squares (10 parameters), q_k spread over [0.3, 1], q_lk = 0.7, batches of "
        f"{BATCH}; in-process runs of the real strategy and clients; burn-in {BURN_IN:g} time constants, then the "
        f"network mean averaged over {WINDOW:g}; mean ± 95% interval over seeds {rep['seeds']}.",
        "",
        "| graph, rule | T | mu | iterations | mean to limit | mean to w_o | mean to plain | ‖w_o - limit‖ "
        "| noise (half-split) | steady MSD to limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in rep["limit"]["groups"]:
        for row in g["rows"]:
            lines.append(
                f"| {g['graph']}, {g['combination']} | {g['T']} | {row['mu']} | {min(row['rounds'])}-"
                f"{max(row['rounds'])} | {_ci(row['to-limit'], '.4f')} | {_ci(row['to-w_o'], '.4f')} "
                f"| {_ci(row['to-plain'], '.4f')} | {_ci(row['w_o-to-limit'], '.4f')} "
                f"| {_ci(row['half-split'], '.4f')} | {_ci(row['msd-limit'], '.2e')} |"
            )
    lines += [
        "",
        f"Fitted log-log slopes against mu (per seed, then mean ± 95% interval). Where the mean was not within half "
        f"the gap at mu = {rep['mus'][-1]}, mu was halved again for every seed, up to {rep['extra-halvings']} times:",
        "",
        "| graph, rule | T | mu fitted | mean to limit | mean to w_o | MSD to limit "
        "| at the smallest mu: nearer the limit than half ‖w_o - limit‖ |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in rep["limit"]["groups"]:
        s = g["slopes"]
        cells = [f"{s[k]['slope']:.2f} [{s[k]['low']:.2f}, {s[k]['high']:.2f}]" for k in ("to-limit", "to-w_o",
                                                                                          "msd-limit")]  # fmt: skip
        fitted_mus = f"{g['mus'][0]:g} to {g['mus'][-1]:g}"
        verdict = f"{g['criteria']['nearer-limit-than-half-gap-at-smallest-mu']} (mu {g['mus'][-1]:g})"
        lines.append(f"| {g['graph']}, {g['combination']} | {g['T']} | {fitted_mus} | {' | '.join(cells)} "
                     f"| {verdict} |")  # fmt: skip
    if rep.get("flower-check"):
        lines += ["", "In-process driver against `flwr run` (seed 0, T = 1, mu = "
                  f"{CHECK_MU}, every agent's model after each of {CHECK_ROUNDS} rounds):", ""]  # fmt: skip
        for c in rep["flower-check"]:
            verdict = "identical" if c["identical"] else f"max |difference| {c['max-abs-difference']:.2e}"
            lines.append(f"- {c['graph']}, {c['combination']}: {verdict} (largest |weight| {c['scale']:.2f})")
    if rep.get("fedavg"):
        f = rep["fedavg"]
        lines += [
            "",
            f"FedAvg as diffusion (eq. 15, q_k = {f['q']}, T = {f['T']}, mu = {f['mu']}, {f['rounds']} rounds) against "
            f"the `fedavg` strategy (fraction-fit {f['q']}, {f['T']} local steps, lr {f['mu']}): final test loss "
            f"{f['diffusion-loss']:.4f} against {f['fedavg-loss']:.4f}; network mean to the plain optimum "
            f"{f['diffusion-to-plain']:.3f}.",
        ]
    return "\n".join(lines) + "\n"


def plot_limit(rep: dict, path: Path) -> None:
    """Distances of the averaged mean and the steady MSD against mu, log-log, one panel per (graph, T)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = rep["limit"]["groups"]
    fig, axes = plt.subplots(2, len(groups), figsize=(3.6 * len(groups), 7), squeeze=False)
    for col, g in enumerate(groups):
        mus = [row["mu"] for row in g["rows"]]
        ax = axes[0][col]
        for name, colour in (("limit", "tab:red"), ("w_o", "tab:blue"), ("plain", "tab:grey")):
            means = [row[f"to-{name}"][0] for row in g["rows"]]
            halves = [row[f"to-{name}"][1] for row in g["rows"]]
            s = g["slopes"][f"to-{name}"]["slope"]
            ax.errorbar(mus, means, yerr=halves, marker="o", color=colour, capsize=3, label=f"to {name} ({s:.2f})")
        gap = [row["w_o-to-limit"][0] for row in g["rows"]]
        ax.plot(mus, gap, "--", color="black", lw=0.8, label="‖w_o - limit‖")
        ax.set_title(f"{g['graph']}/{g['combination']}, T={g['T']}", fontsize=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
        ax = axes[1][col]
        means = [row["msd-limit"][0] for row in g["rows"]]
        ax.errorbar(mus, means, yerr=[row["msd-limit"][1] for row in g["rows"]], marker="o", capsize=3,
                    label=f"slope {g['slopes']['msd-limit']['slope']:.2f}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mu")
        ax.legend(fontsize=7)
        for ax in (axes[0][col], axes[1][col]):  # label the mu values run; log minor labels overlap
            ax.set_xticks(mus, [f"{m:g}" for m in mus], rotation=45, fontsize=7)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0][0].set_ylabel("distance of the time-averaged mean")
    axes[1][0].set_ylabel("steady MSD to the limit")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_msd(results: list[dict], path: Path) -> None:
    """MSD to the limit per iteration, seed 0, every (graph, T, mu)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({r["T"] for r in results})
    fig, axes = plt.subplots(1, len(steps), figsize=(7 * len(steps), 4.5), squeeze=False, sharey=True)
    for ax, t in zip(axes[0], steps, strict=True):
        for r in sorted((r for r in results if r["seed"] == 0 and r["T"] == t), key=lambda r: (r["graph"], -r["mu"])):
            rounds, msd, _ = zip(*r["curve"], strict=True)
            ax.loglog(rounds, msd, lw=0.8, label=f"{r['graph']} mu={r['mu']}")
        ax.set_title(f"MSD to the limit, T = {t}, seed 0")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("1/K sum ||w_k - w_lim||^2")
    axes[0][-1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = arguments(__doc__, out="diffusion_theory.json", quick="ring, T = 1, mu 0.04 and 0.02, seeds 0-1")
    parser.add_argument("--no-flower", action="store_true", help="only the in-process runs (no check, no FedAvg)")
    parser.add_argument("--federation", default="client-resources-num-cpus=1")
    args = parser.parse_args()
    networks, steps, mus, seeds = NETWORKS, STEPS, MUS, SEEDS
    if args.quick:
        networks, steps, mus, seeds = NETWORKS[:1], (1,), MUS[:2], SEEDS[:2]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=KEY_FIELDS)
    started = time.perf_counter()
    results = []

    def recalled_or_run(graph: str, rule: str, t: int, mu: float, seed: int) -> dict:
        fields = {"graph": graph, "T": t, "mu": mu, "seed": seed, "burn-in": BURN_IN, "window": WINDOW}
        if (done := log.get(fields)) is None:
            done = limit_run(graph, rule, t, mu, seed)
            log.append(done)
            print(f"[{time.perf_counter() - started:6.0f} s] {graph} T={t} mu={mu} seed {seed}: {done['rounds']} "
                  f"iterations, to limit {done['distance']['limit']:.4f}, to w_o {done['distance']['w_o']:.4f} "
                  f"(gap {done['w_o-to-limit']:.4f}), {done['seconds']:.0f} s", flush=True)  # fmt: skip
        results.append(done)
        return done

    for seed in seeds:  # seed-major, so a partial log covers every configuration
        for graph, rule in networks:
            for t in steps:
                for mu in mus:
                    recalled_or_run(graph, rule, t, mu, seed)
    # where the mean is not yet nearer the limit than half the gap at the smallest mu, halve mu (at most
    # EXTRA_HALVINGS times): the O(mu) constant grows with T and the graph's consensus time
    for graph, rule in networks:
        for t in steps:
            mu = mus[-1]
            for _ in range(0 if args.quick else EXTRA_HALVINGS):
                at = [r for r in results if (r["graph"], r["T"], r["mu"]) == (graph, t, mu)]
                if all(r["distance"]["limit"] < 0.5 * r["w_o-to-limit"] for r in at):
                    break
                mu /= 2
                for seed in seeds:
                    recalled_or_run(graph, rule, t, mu, seed)
    rep: dict = {"benchmark": "B3", "quick": args.quick, "seeds": list(seeds), "mus": list(mus),
                 "extra-halvings": EXTRA_HALVINGS, "limit": summarise(results, seeds)}  # fmt: skip
    if not args.no_flower:
        with tempfile.TemporaryDirectory() as tmp, local_simulation() as sim:
            checks = []
            for graph, rule in networks:
                key = {"graph": f"check-{graph}", "T": 1, "mu": CHECK_MU, "seed": 0, "burn-in": "", "window": ""}
                if (done := log.get(key)) is None:
                    done = key | {"check": flower_check(sim, graph, rule, tmp, args.federation)}
                    log.append(done)
                checks.append(done["check"])
            rep["flower-check"] = checks
            if not args.quick:
                key = {"graph": "fedavg-comparison", "T": 5, "mu": FEDAVG_MU, "seed": 0, "burn-in": "", "window": ""}
                if (done := log.get(key)) is None:
                    done = key | {"comparison": compare_fedavg(sim, tmp, args.federation)}
                    log.append(done)
                rep["fedavg"] = done["comparison"]
    rep |= {**stamp(), "compute-seconds": sum(r["seconds"] for r in results)}
    write_report(args.out, rep, markdown(rep), indent=1)
    plot_limit(rep, args.out.with_name(args.out.stem.replace("diffusion_theory", "diffusion_limit") + ".png"))
    plot_msd(results, args.out.with_name(args.out.stem.replace("diffusion_theory", "diffusion_msd") + ".png"))
    print(markdown(rep))


if __name__ == "__main__":
    main()
