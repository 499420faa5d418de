"""What a simulation costs as the federation grows: 100, 300 and 1,000 simulated SuperNodes through ``flwr run``.

Every run: the ``synthetic`` dataset (every client holds data), model ``logreg``, 10
clients a round, federated evaluation every round over a 20-client sample, 5 rounds,
``min-available-clients`` = N (the preflight asks every node), one CPU per client,
a fresh private SuperLink. Measured per run:

- start-up: submission (just before ``flwr run``) to the start of round 1, from the
  server's ``summary.json`` timing (Unix start of the server, seconds to the first
  round), and within it the preflight's seconds;
- wall minus rounds: the run's wall time less its rounds (start-up and shutdown), the
  one start-up figure an app without the timing also gives (``--label before``);
- seconds per round (fit and evaluation) and per evaluation phase (medians);
- peak memory: PSS summed over the run's processes (SuperLink, simulation, Ray
  workers; as B4 measures it), sampled every 0.2 s.

``--app-dir`` measures another checkout of the app (a git worktree of an older
commit) under ``--label``, so a fix can be measured before and after, side by side
in one JSON. Runs are appended to ``bench/results/scale_runs.jsonl`` and not run again.

    python -m bench.scale --quick                                 # 100 and 300 nodes, one repeat
    python -m bench.scale                                         # 100, 300, 1,000 nodes, 2 repeats
    python -m bench.scale --app-dir ../old-worktree --label before
    python -m bench.scale --preflight-sample 100 --label sampled
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import REPO, RunLog, arguments, local_simulation, read_records, stamp, write_report
from bench.samplers import PeakSampler

SIZES = (100, 300, 1000)
PER_ROUND, EVAL_SAMPLE, ROUNDS = 10, 20, 5
FEDERATION = "client-resources-num-cpus=1"


def run_config(num_nodes: int, results: str, name: str, preflight_sample: int = 0) -> dict:
    extra = {"preflight-sample": preflight_sample} if preflight_sample else {}  # an older app may lack the key
    return extra | {
        "strategy": "fedavg", "dataset": "synthetic", "model": "logreg", "partitioner": "natural",
        "num-server-rounds": ROUNDS, "eval-every": 1, "fraction-fit": (PER_ROUND + 0.5) / num_nodes,
        "min-fit-clients": PER_ROUND, "fraction-evaluate": (EVAL_SAMPLE + 0.5) / num_nodes,
        "min-available-clients": num_nodes, "local-steps": 5, "batch-size": 16, "adapt-steps": 0,
        "results-dir": results, "run-name": name,
    }  # fmt: skip


def measure(app_dir: Path, num_nodes: int, preflight_sample: int = 0) -> dict:
    """One run of ``num_nodes`` SuperNodes on a fresh private SuperLink."""
    with tempfile.TemporaryDirectory() as results, local_simulation(app_dir=app_dir) as sim:
        sampler = PeakSampler(str(sim.home))
        sampler.start()
        submitted = time.time()
        config = run_config(num_nodes, results, "scale", preflight_sample)
        outcome = sim.run(run_config=config, num_supernodes=num_nodes,
                          extra_federation=FEDERATION, timeout_s=1800)  # fmt: skip
        sampler.done.set()
        sampler.join()
        if not outcome.ok:
            raise SystemExit(f"{num_nodes} nodes: {outcome.status}\n{outcome.log_tail}")
        records, summary = read_records(Path(results) / "scale")
    rounds = [r["round-seconds"] for r in records]
    out = {
        "nodes": num_nodes, "wall-seconds": outcome.wall_seconds,
        "wall-minus-rounds-seconds": outcome.wall_seconds - sum(rounds),
        "round-seconds": statistics.median(rounds), "peak-pss-mib": sampler.peak_pss,
        "peak-rss-mib": sampler.peak_rss, "clients-per-round": statistics.median(r["clients-sampled"] for r in records),
        "eval-clients": statistics.median(r.get("eval-clients", 0) for r in records),
    }  # fmt: skip
    timing = summary.get("timing")
    if timing:  # apps from before the server recorded its timing have none
        out["startup-seconds"] = timing["server-started-unix"] + timing["first-round-start-seconds"] - submitted
        out["preflight-seconds"] = timing.get("preflight-seconds")
        out["evaluate-seconds"] = statistics.median(r["evaluate-seconds"] for r in records)
        out["fit-seconds"] = statistics.median(r["round-seconds"] - r["evaluate-seconds"] for r in records)
    return out


def summarise(results: list[dict]) -> dict:
    """Medians over repeats per (label, nodes), and the start-up ratio of the largest to the smallest."""
    rows = {}
    for r in results:
        rows.setdefault((r["label"], r["nodes"]), []).append(r)
    table = []
    for (label, nodes), runs in sorted(rows.items()):
        keys = [k for k in runs[0] if isinstance(runs[0][k], int | float) and k not in ("nodes", "repeat")]
        row = {"label": label, "nodes": nodes, "repeats": len(runs)}
        for key in keys:
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        table.append(row)
    ratios = {}
    for label in {row["label"] for row in table}:
        mine = sorted((row for row in table if row["label"] == label), key=lambda row: row["nodes"])
        if len(mine) > 1:
            small, large = mine[0], mine[-1]
            key = "startup-seconds" if small.get("startup-seconds") else "wall-minus-rounds-seconds"
            ratios[label] = {"measure": key, "nodes": [small["nodes"], large["nodes"]],
                             "ratio": large[key] / small[key]}  # fmt: skip
    return {"rows": table, "startup-ratio": ratios}


def markdown(rep: dict) -> str:
    lines = [
        f"{PER_ROUND} clients a round, evaluation over {EVAL_SAMPLE} every round, {ROUNDS} rounds, synthetic/logreg, "
        f"{FEDERATION}; medians over repeats. Start-up = submission to round 1.",
        "",
        "| app | nodes | start-up s | preflight s | wall - rounds s | s/round | fit s | evaluate s | peak PSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(value: float | None, fmt: str = ".2f") -> str:
        return "-" if value is None else f"{value:{fmt}}"

    for r in rep["rows"]:
        lines.append(
            f"| {r['label']} | {r['nodes']:,} | {f(r.get('startup-seconds'), '.1f')} "
            f"| {f(r.get('preflight-seconds'), '.1f')} | {f(r['wall-minus-rounds-seconds'], '.1f')} "
            f"| {f(r['round-seconds'])} | {f(r.get('fit-seconds'))} | {f(r.get('evaluate-seconds'))} "
            f"| {f(r['peak-pss-mib'], ',.0f')} |"
        )
    for label, ratio in rep["startup-ratio"].items():
        lines.append(f"\n{label}: {ratio['measure']} at {ratio['nodes'][1]:,} nodes / {ratio['nodes'][0]:,} = "
                     f"{ratio['ratio']:.2f}")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = arguments(__doc__, out="scale.json", quick="100 and 300 nodes, one repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="numbers of SuperNodes")
    parser.add_argument("--app-dir", type=Path, default=REPO, help="the app to measure (default: this checkout)")
    parser.add_argument("--label", default="now", help="the name of this app's rows")
    parser.add_argument("--preflight-sample", type=int, default=0, help="run config preflight-sample (0: every node)")
    args = parser.parse_args()
    sizes, repeats = (SIZES[:2], 1) if args.quick else (tuple(args.sizes), args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=("label", "nodes", "repeat"))
    for repeat in range(repeats):  # repeat-major: the sizes alternate, so a drift in the machine hits them alike
        for nodes in sizes:
            fields = {"label": args.label, "nodes": nodes, "repeat": repeat}
            if log.get(fields) is None:
                result = fields | measure(args.app_dir.resolve(), nodes, args.preflight_sample)
                log.append(result)
                print(json.dumps(result), flush=True)
    rep = {"benchmark": "scale", **stamp(), **summarise(list(log.results.values()))}
    write_report(args.out, rep, markdown(rep), indent=1)
    print(markdown(rep))


if __name__ == "__main__":
    main()
