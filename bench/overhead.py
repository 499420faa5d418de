"""Benchmark B4: what Flower costs. The same client work through Flower's simulation engine and in a plain loop.

Per-FedAvg HF on B1's split of ``../shared/data/mnist-10k`` (50 users, a = 34), tau = 10,
batches of 40, 10 clients a round, no evaluation rounds (``fraction-evaluate = 0``):

(a) Flower: ``flwr run`` through ``app.local.simulation.LocalSimulation``, exactly as
    ``flwr run .`` runs it (50 SuperNodes, Ray backend; the round engine on Flower's
    Message API, each phase sent and awaited at once; the legacy API was measured here
    until issue 69 removed it); seconds per round are the run's own ``round-seconds``
    (the fit's configuration to the round's record);
(b) plain loop: one process builds the 50 clients once from the same client classes
    and calls their ``fit`` with the strategy's own fit configs, then averages.

Each case runs ``--warmup`` rounds that are not counted, then ``--rounds`` timed ones.
Flower on each API and the plain loop alternate, ``--repeats`` times; each ratio is
taken per repeat and the median reported. The start-up cost (everything before round 1 and
after the last round: SuperLink, Ray, preflight, shutdown) is reported apart. Peak
memory is the largest sum, over the run's processes, of their proportional set size
(PSS, shared pages divided among the processes sharing them), sampled every 0.2 s;
RSS sums are given too.

    python -m bench.overhead                  # the README's table: 3 cases x 2 actor settings, 1 repeat (~25 min)
    python -m bench.overhead --quick          # 1 repeat, 2 + 8 rounds, main case only
    python -m bench.overhead --profile        # plain-loop cProfile of one client message path
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.harness import (
    REPO,
    SHARED_DATA,
    arguments,
    local_simulation,
    machine,
    results_folder,
    script_command,
    write_report,
)
from bench.samplers import PeakSampler

IMAGES_PER_CLASS, USERS, BETA, ALPHA = 34, 50, 0.1, 0.001
CASES = {  # name -> (strategy, fraction-fit)
    "perfedavg-hf-10": ("perfedavg", 0.2),
    "fedavg-10": ("fedavg", 0.2),
    "perfedavg-hf-50": ("perfedavg", 1.0),
}
ACTORS = {  # name -> --federation-config resources: CPUs each ClientApp worker reserves
    "1-actor (2 cpus each, Flower's default)": "client-resources-num-cpus=2",
    "2-actors (1 cpu each)": "client-resources-num-cpus=1",
}


THIS = "this checkout"


@dataclass(frozen=True)
class Variant:
    """What one column of Flower runs measures: the code (a checkout's root) and run-config values beside the case's."""

    label: str
    root: Path = REPO
    config: tuple[tuple[str, object], ...] = ()


def variants_of(baseline: Path | None, pull_intervals: list[float]) -> list[Variant]:
    """This checkout; an earlier checkout (``--baseline``, before a change); this checkout at other pull intervals."""
    found = [Variant(THIS)]
    if baseline is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=baseline, capture_output=True,
                                text=True).stdout.strip()  # fmt: skip
        found.append(Variant(f"baseline {commit}", baseline.resolve()))
    found += [Variant(f"pull-interval {p:g}", REPO, (("pull-interval", p),)) for p in pull_intervals]
    return found


def run_config(case: str, rounds: int, results: str, variant: Variant = Variant(THIS)) -> dict:
    strategy, fraction = CASES[case]
    return {**dict(variant.config),
        "strategy": strategy, "dataset": "mnist", "data-dir": str(SHARED_DATA / "mnist-10k"),
        "partitioner": "perfedavg-paper", "images-per-class": IMAGES_PER_CLASS, "model": "mlp", "seed": 0,
        "num-server-rounds": rounds, "fraction-fit": fraction, "fraction-evaluate": 0.0, "aggregation": "uniform",
        "local-steps": 10, "lr": BETA, "perfedavg-beta": BETA, "perfedavg-alpha": ALPHA, "perfedavg-delta": 1e-3,
        "perfedavg-variant": "hf", "batch-size": 40, "perfedavg-outer-batch-size": 40,
        "perfedavg-hessian-batch-size": 40, "adapt-batch-size": 40,
        "results-dir": results, "run-name": f"{case}-{time.monotonic_ns()}",
    }  # fmt: skip



# ------------------------------------------------------------------ the two paths


def null_app(folder: Path, root: Path = REPO) -> Path:
    """``root``'s app with its ``bench/null_app/nullclient.py`` as the ClientApp (same config keys and ServerApp)."""
    folder.mkdir(parents=True, exist_ok=True)
    pyproject = (root / "pyproject.toml").read_text()
    pyproject = pyproject.replace('clientapp = "app.client_app:app"', 'clientapp = "nullclient:app"')
    pyproject = pyproject.replace('name = "stamen"', 'name = "stamen-null"')
    start = pyproject.index("fab-include = ")  # the FAB holds the client module; stamen's folders come from PYTHONPATH
    pyproject = pyproject[:start] + 'fab-include = ["nullclient.py"]' + pyproject[pyproject.index("\n", start):]
    (folder / "pyproject.toml").write_text(pyproject)
    (folder / "nullclient.py").write_text((root / "bench" / "null_app" / "nullclient.py").read_text())
    return folder


def flower_case(case: str, federation: str, *, variant: Variant, warmup: int, rounds: int, results: Path,
                null: bool = False) -> dict:  # fmt: skip
    config = run_config(case, warmup + rounds, str(results), variant)
    app_dir = null_app(results / f"null-app-{abs(hash(variant.root))}", variant.root) if null else variant.root
    # the null app imports stamen's folders by their short names: the checkout goes on its processes' PYTHONPATH
    with local_simulation(app_dir=app_dir, pythonpath=[variant.root] if null else [], workdir=variant.root) as sim:
        sampler = PeakSampler(str(sim.home))
        sampler.start()
        outcome = sim.run(run_config=config, num_supernodes=USERS, extra_federation=federation, timeout_s=3600)
        sampler.done.set()
        sampler.join()
    if not outcome.ok:
        raise RuntimeError(f"{case}: {outcome.status}\n{outcome.log_tail}")
    records = [json.loads(line) for line in (results / config["run-name"] / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["round-seconds"] for r in records]
    return {"round-seconds": seconds[warmup:], "startup-seconds": outcome.wall_seconds - sum(seconds),
            "peak-pss-mib": sampler.peak_pss, "peak-rss-mib": sampler.peak_rss, "cpu-seconds": sampler.cpu_seconds,
            "final-train-loss": records[-1]["train-loss"]}  # fmt: skip


def plain_loop(case: str, *, warmup: int, rounds: int) -> dict:
    """The same clients and configs in one process: the floor Flower is measured against."""
    import numpy as np

    from app.config import parse_settings
    from app.local.inprocess import build_clients
    from app.server_run import build_strategy

    started = time.perf_counter()
    settings = parse_settings(run_config(case, warmup + rounds, "/tmp"))
    strategy = build_strategy(settings)
    clients = build_clients(settings, USERS)
    params = strategy.global_model
    per_round = max(int(USERS * settings.run.fraction_fit), settings.run.min_fit_clients)
    rng = np.random.default_rng(0)
    startup = time.perf_counter() - started
    seconds, losses = [], []
    for server_round in range(1, warmup + rounds + 1):
        begin = time.perf_counter()
        config = strategy.fit_config(server_round)
        replies = [clients[k].fit(params, config) for k in rng.choice(USERS, per_round, replace=False)]
        params = [np.mean([r[0][i] for r in replies], axis=0) for i in range(len(params))]  # uniform, as B1
        seconds.append(time.perf_counter() - begin)
        losses.append(float(np.mean([r[2]["train-loss"] for r in replies])))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"round-seconds": seconds[warmup:], "startup-seconds": startup, "peak-rss-mib": peak,
            "final-train-loss": losses[-1]}  # fmt: skip


def plain_case(case: str, *, warmup: int, rounds: int) -> dict:
    """The plain loop in a fresh process, so its peak memory is its own."""
    out = subprocess.run([*script_command(__file__), "--plain-child", case, str(warmup), str(rounds)], cwd=REPO,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile_plain(case: str) -> None:
    """cProfile of 5 plain-loop rounds, top functions by cumulative time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    plain_loop(case, warmup=0, rounds=5)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


# ------------------------------------------------------------------ report


def spread(values: list[float]) -> dict:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": quartiles[0], "q3": quartiles[2], "min": min(values),
            "max": max(values), "n": len(values)}  # fmt: skip


def main() -> None:
    parser = arguments(__doc__, quick="main case only, 1 repeat, 2 + 8 rounds")
    parser.add_argument("--repeats", type=int, default=1, help="Flower/plain pairs per setting (default 1)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--baseline", type=Path, help="an earlier checkout measured beside this one (before a change)")
    parser.add_argument("--pull-intervals", nargs="*", type=float, default=[],
                        help="this checkout again at these pull-interval values (the simulation's grid)")
    parser.add_argument("--profile", action="store_true", help="cProfile the plain loop and exit")
    parser.add_argument("--plain-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        case, warmup, rounds = args.plain_child
        print(json.dumps(plain_loop(case, warmup=int(warmup), rounds=int(rounds))))
        return
    if args.profile:
        profile_plain("perfedavg-hf-10")
        return
    if not (SHARED_DATA / "mnist-10k").is_dir():
        sys.exit(f"B4 needs {SHARED_DATA / 'mnist-10k'}")
    os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    cases, actors = args.cases, list(ACTORS)
    if args.quick:
        args.repeats, args.warmup, args.rounds, cases = 1, 2, 8, ["perfedavg-hf-10"]
    results = Path("/tmp") / f"stamen-b4-{os.getpid()}"
    variants = variants_of(args.baseline, args.pull_intervals)
    rows = []
    for case in cases:
        for actor in actors:
            pairs = []
            for repeat in range(args.repeats):
                flower = {v.label: flower_case(case, ACTORS[actor], variant=v, warmup=args.warmup, rounds=args.rounds,
                                               results=results) for v in variants}  # fmt: skip
                plain = plain_case(case, warmup=args.warmup, rounds=args.rounds)
                floor = statistics.median(plain["round-seconds"])
                ratios = {api: statistics.median(f["round-seconds"]) / floor for api, f in flower.items()}
                pairs.append({"flower": flower, "plain": plain, "ratio": ratios})
                shown = ", ".join(f"{api} {statistics.median(f['round-seconds']):.3f} s/round (ratio {ratios[api]:.2f},"
                                  f" start-up {f['startup-seconds']:.1f} s)" for api, f in flower.items())  # fmt: skip
                print(f"{case:16s} {actor:40s} repeat {repeat}: {shown}; plain {floor:.3f} s/round", flush=True)
            for api in (v.label for v in variants):
                runs = [p["flower"][api] for p in pairs]
                rows.append({
                    "case": case, "actors": actor, "code": api, "federation-config": ACTORS[actor],
                    "ratio-median": statistics.median(p["ratio"][api] for p in pairs),
                    "flower-round-seconds": spread([s for run in runs for s in run["round-seconds"]]),
                    "plain-round-seconds": spread([s for p in pairs for s in p["plain"]["round-seconds"]]),
                    "flower-startup-seconds": statistics.median(run["startup-seconds"] for run in runs),
                    "plain-startup-seconds": statistics.median(p["plain"]["startup-seconds"] for p in pairs),
                    "flower-peak-pss-mib": max(run["peak-pss-mib"] for run in runs),
                    "flower-peak-rss-mib": max(run["peak-rss-mib"] for run in runs),
                    "plain-peak-rss-mib": max(p["plain"]["peak-rss-mib"] for p in pairs),
                    "final-train-loss": [run["final-train-loss"] for run in runs],
                    "pairs": [{"flower": p["flower"][api], "plain": p["plain"], "ratio": p["ratio"][api]}
                              for p in pairs],
                })  # fmt: skip
            if case == cases[0] and args.quick:
                break
    floors = {}
    for actor in actors:  # Flower's floor: the main case's rounds with no client work
        for v in variants:
            floor = flower_case("perfedavg-hf-10", ACTORS[actor], variant=v, warmup=args.warmup, rounds=args.rounds,
                                results=results, null=True)  # fmt: skip
            floors[f"{actor}, {v.label}"] = {"actors": actor, "code": v.label, "cpu-seconds": floor["cpu-seconds"],
                                             "round-seconds": spread(floor["round-seconds"]),
                                             "startup-seconds": floor["startup-seconds"]}  # fmt: skip
            print(f"floor (no client work) {actor}, {v.label}: {statistics.median(floor['round-seconds']):.3f} s/round,"
                  f" {floor['cpu-seconds']:.1f} CPU-s", flush=True)
        if args.quick:
            break
    payload = {"benchmark": "B4", "machine": machine(), "cpus": os.cpu_count(), "warmup": args.warmup,
               "rounds": args.rounds, "repeats": args.repeats, "rows": rows, "floor": floors}  # fmt: skip
    lines = ["| case | Ray actors | code | Flower s/round (median [q1, q3]) | plain s/round | ratio | "
             "Flower start-up s | plain start-up s | Flower peak PSS / RSS MiB | plain peak RSS MiB |",
             "|---|---|---|---|---|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in rows:
        f, p = r["flower-round-seconds"], r["plain-round-seconds"]
        lines.append(f"| {r['case']} | {r['actors']} | {r['code']} | {f['median']:.3f} [{f['q1']:.3f}, "
                     f"{f['q3']:.3f}] | {p['median']:.3f} [{p['q1']:.3f}, {p['q3']:.3f}] | {r['ratio-median']:.2f} | "
                     f"{r['flower-startup-seconds']:.1f} | {r['plain-startup-seconds']:.1f} | "
                     f"{r['flower-peak-pss-mib']:.0f} / {r['flower-peak-rss-mib']:.0f} | "
                     f"{r['plain-peak-rss-mib']:.0f} |")  # fmt: skip
    lines += ["", "| Ray actors | code | Flower s/round with no client work (median [q1, q3]) | CPU-s of the run |",
              "|---|---|---|---:|"]  # fmt: skip
    for floor in floors.values():
        f = floor["round-seconds"]
        lines.append(f"| {floor['actors']} | {floor['code']} | {f['median']:.3f} [{f['q1']:.3f}, {f['q3']:.3f}] | "
                     f"{floor['cpu-seconds']:.1f} |")
    write_report(results_folder(args.quick) / "overhead.json", payload, "\n".join(lines) + "\n", stamped=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
