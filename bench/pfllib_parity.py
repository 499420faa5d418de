"""B8 beside PFLlib's own code: five methods on the same clients' data, PFLlib's budget, curves side by side.

PFLlib (``bench/pfllib_setup.py``: its pinned commit, unchanged) and stamen run FedAvg,
Per-FedAvg, Ditto, FedRep and FedProto on **the same client files**: stamen's
``pfllib-practical`` split of CIFAR-10 (B8's data keys: Dirichlet(0.1) over 20 clients,
train and test pooled, 25% of each client's share held out; B8's per-channel
normalisation), each client's tensors exactly as stamen trains on them, written in
PFLlib's per-client format. Both systems' fingerprints of the clients (SHA-256 of every
array, PFLlib's read back through its own ``read_client_data``) must agree.

The budget is PFLlib's defaults: batch 10, lr 0.005, one local epoch, every client every
round, FedAvgCNN; stamen's runs use the same settings (:func:`stamen_config`), which
needed epochs where stamen counts steps: ``ditto-personal-epochs``,
``fedrep-head-epochs`` and Per-FedAvg's ``local-epochs``. PFLlib's Per-FedAvg calls its
client's ``train()`` twice a round (``serverperavg.py``), each a pass of meta-steps on a
batch of 20 split into D and D': two passes in stamen's terms.

Each run evaluates every ``--every`` rounds; a round's figure is PFLlib's own (correct
over all the clients' test examples), with the client mean beside it. Per method and
round the report gives both systems' mean over the seeds and the seed-paired gap with its
95% interval. Runs go two side by side, one thread each (``--workers``).

Usage::

    python -m bench.pfllib_parity                     # seeds 0 1 2, 10 rounds, every 2
    python -m bench.pfllib_parity --report-only
    python -m bench.pfllib_parity --quick             # one round of FedAvg, seed 0 (scratch)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import REPO, RESULTS, RunLog, arguments, fmt, interval, script_command, stamp, write_report
from bench.pfllib_setup import (
    ALGORITHMS,
    CACHE,
    PFLLIB_COMMIT,
    PFLLIB_DEFAULTS,
    checkout,
    dataset_name,
    export,
    pfllib_python,
    run_pfllib,
)

CLIENTS = 20
SYSTEMS = ("stamen", "pfllib")
KEY_FIELDS = ("system", "method", "seed", "rounds", "every")

# the evaluation each system reports for a method, where it is not the personalised accuracy of the same model
EVALUATED = {
    "fedavg": "the global model (no adaptation)",
    "perfedavg": "one SGD step of size alpha = lr on a batch of 10 of the client's training data, then the test",
    "ditto": "the personal model",
    "fedrep": "the global body with the client's own head",
    "fedproto": "each client's own model (its head); PFLlib's own figure, the nearest global prototype, beside it",
}


def stamen_config(method: str, *, seed: int, rounds: int, every: int) -> dict:
    """stamen's run config for ``method`` at PFLlib's defaults on B8's practical split."""
    from bench.cifar_setup import CIFAR, CONDITIONS, DATA

    epochs = PFLLIB_DEFAULTS["local-epochs"]
    own = {
        "fedavg": {},
        # PFLlib: alpha = beta = lr, first-order, train() twice a round; its test adapts one step of lr
        "perfedavg": {"perfedavg-variant": "fo", "perfedavg-alpha": PFLLIB_DEFAULTS["lr"],
                      "perfedavg-beta": PFLLIB_DEFAULTS["lr"], "local-epochs": 2 * epochs, "adapt-steps": 1},
        # PFLlib's mu 0 (no pull towards the global model), the personal model at lr for one epoch
        "ditto": {"ditto-lambda": 0.0, "ditto-personal-lr": PFLLIB_DEFAULTS["lr"], "ditto-personal-epochs": epochs},
        "fedrep": {"fedrep-personal-layers": 1, "fedrep-head-epochs": epochs},
        "fedproto": {"fedproto-lambda": 1.0},
    }[method]  # fmt: skip
    return {**DATA, **CONDITIONS["practical"].config, "data-dir": str(CIFAR), "model": "fedavg-cnn",
            "strategy": method, "seed": seed, "num-server-rounds": rounds, "eval-every": every, "num-threads": 1,
            "lr": PFLLIB_DEFAULTS["lr"], "batch-size": PFLLIB_DEFAULTS["batch-size"], "local-epochs": epochs,
            "aggregation": "examples", "fraction-fit": 1.0, "fraction-evaluate": 1.0, "min-fit-clients": CLIENTS,
            "min-available-clients": CLIENTS, "adapt-steps": 0, "adapt-batch-size": 10, **own}  # fmt: skip


def client_arrays(seed: int) -> list[tuple]:
    """Every client's (train x, train y, test x, test y) as stamen's clients hold them for seed ``seed``."""
    from app.config import parse_settings
    from app.local.inprocess import build_clients

    clients = build_clients(parse_settings(stamen_config("fedavg", seed=seed, rounds=1, every=1)), CLIENTS)
    return [arrays_of(c) for c in clients]


def arrays_of(client) -> tuple:
    """A stamen client's (train x, train y, test x, test y) as the arrays it trains and tests on."""
    return tuple(t.cpu().numpy() for t in (client.train_x, client.train_y, client.test_x, client.test_y))


def prepare(root: Path, seed: int) -> str:
    """Seed ``seed``'s clients in PFLlib's format under :data:`CACHE` (once), linked into PFLlib's dataset folder."""
    folder = CACHE / "data" / dataset_name(seed)
    if not (folder / "fingerprint.json").exists():
        export(client_arrays(seed), folder)
        print(f"exported seed {seed}'s clients to {folder}", flush=True)
    link = root / "dataset" / dataset_name(seed)
    if not link.exists():
        link.symlink_to(folder, target_is_directory=True)
    return json.loads((folder / "fingerprint.json").read_text())["sha256"]


def stamen_run(method: str, *, seed: int, rounds: int, every: int) -> dict:
    """stamen's run in this process, its clients' fingerprint and an evaluation every ``every`` rounds."""
    import torch

    from app.local.inprocess import InProcessRun
    from bench.pfllib_setup import fingerprint

    torch.set_num_threads(1)
    started = time.perf_counter()
    run = InProcessRun(run_config=stamen_config(method, seed=seed, rounds=rounds, every=every), num_clients=CLIENTS)
    held = fingerprint(arrays_of(c) for c in run.clients)
    evaluations = []
    for _ in range(rounds):
        run.step()
        if run.round % every == 0:
            metrics = run.evaluate()
            evaluations.append({"round": run.round, "accuracy": metrics["accuracy"],
                                "accuracy-client-mean": metrics["accuracy-client-mean"],
                                "global-accuracy": metrics.get("global-accuracy")})  # fmt: skip
    return {"evaluations": evaluations, "read-fingerprint": held, "wall-seconds": time.perf_counter() - started}


def pfllib_figures(result: dict) -> list[dict]:
    """PFLlib's recorded per-client counts as the figures stamen reports (round 0, before training, left out)."""
    out = []
    for entry in result["evaluations"]:
        if entry["round"] == 0:
            continue
        correct, examples = entry["correct"], entry["examples"]
        figures = {
            "round": entry["round"],
            "accuracy": sum(correct) / sum(examples),
            "accuracy-client-mean": sum(c / n for c, n in zip(correct, examples, strict=True)) / len(examples),
        }
        if "own-model-correct" in entry:  # FedProto: the own model is what stamen reports; the prototype rule beside
            own = entry["own-model-correct"]
            figures.update({"prototype-accuracy": figures["accuracy"], "accuracy": sum(own) / sum(examples),
                            "accuracy-client-mean": sum(c / n for c, n in zip(own, examples, strict=True))
                            / len(examples)})  # fmt: skip
        out.append(figures)
    return out


def job_command(job: dict, out: Path, args: argparse.Namespace, root: Path) -> tuple[list[str], dict]:
    """The worker's command line and environment for one run."""
    common = ["--method", job["method"], "--seed", str(job["seed"]), "--rounds", str(job["rounds"]),
              "--every", str(job["every"]), "--worker-out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if job["system"] == "pfllib":
        env["PYTHONPATH"] = str(root / "system")
        return [args.python, *script_command(__file__)[1:], "--pfllib-worker", str(root), *common], env
    return [*script_command(__file__), "--stamen-worker", *common], env


def run_jobs(args: argparse.Namespace, root: Path, log: RunLog) -> None:
    fingerprints = {seed: prepare(root, seed) for seed in args.seeds}
    jobs = [{"system": system, "method": method, "seed": seed, "rounds": args.rounds, "every": args.every}
            for seed in args.seeds for method in args.methods for system in SYSTEMS]  # fmt: skip
    todo = [job for job in jobs if log.get(job) is None]
    lock = threading.Lock()
    print(f"B8 parity: {len(todo)} of {len(jobs)} runs to go, {args.workers} side by side", flush=True)

    def one(job: dict) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "result.json"
            command, env = job_command(job, out, args, root)
            logfile = CACHE / "logs" / f"{job['system']}-{job['method']}-s{job['seed']}.log"
            logfile.parent.mkdir(parents=True, exist_ok=True)
            with open(logfile, "w") as sink:
                code = subprocess.run(command, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT).returncode
            if code != 0 or not out.exists():
                print(f"{job}: worker exited {code}; its output is in {logfile}", flush=True)
                return
            result = json.loads(out.read_text())
        result["fingerprint-matches"] = result["read-fingerprint"] == fingerprints[job["seed"]]
        if job["system"] == "pfllib":
            result["figures"] = pfllib_figures(result)
        else:
            result["figures"] = result["evaluations"]
        with lock:
            log.append({**job, **result})
        last = result["figures"][-1]
        print(f"{job['system']} {job['method']} seed {job['seed']}: round {last['round']} accuracy "
              f"{100 * last['accuracy']:.1f} ({result['wall-seconds']:.0f} s), same clients: "
              f"{result['fingerprint-matches']}", flush=True)  # fmt: skip

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(one, todo))


def curve_rows(log: RunLog, args: argparse.Namespace, method: str, column: str) -> list[dict]:
    """Per evaluation round: both systems' mean (95% interval) over the seeds and the seed-paired gap."""
    runs = {(system, seed): log.get({"system": system, "method": method, "seed": seed, "rounds": args.rounds,
                                     "every": args.every}) for system in SYSTEMS for seed in args.seeds}  # fmt: skip
    rows = []
    for round_ in range(args.every, args.rounds + 1, args.every):
        per: dict[str, dict[int, float]] = {system: {} for system in SYSTEMS}
        for (system, seed), run in runs.items():
            figure = next((f for f in (run or {}).get("figures", []) if f["round"] == round_), None)
            if figure is not None and figure.get(column) is not None:
                per[system][seed] = 100 * figure[column]
        paired = sorted(set(per["stamen"]) & set(per["pfllib"]))
        row = {"round": round_, "seeds": paired}
        for system in SYSTEMS:
            if per[system]:
                row[system], row[f"{system}-ci95"] = interval(list(per[system].values()))
                row[f"{system}-per-seed"] = per[system]
        if paired:
            row["gap"], row["gap-ci95"] = interval([per["stamen"][s] - per["pfllib"][s] for s in paired])
            row["within-noise"] = abs(row["gap"]) <= row["gap-ci95"] if len(paired) > 1 else None  # one seed: no noise
        rows.append(row)
    return rows


def report_of(log: RunLog, args: argparse.Namespace) -> dict:
    methods = {}
    logged = []
    for method in args.methods:
        runs = [log.get({"system": system, "method": method, "seed": seed, "rounds": args.rounds,
                         "every": args.every}) for system in SYSTEMS for seed in args.seeds]  # fmt: skip
        done = [r for r in runs if r is not None]
        logged += done
        methods[method] = {
            "pfllib-algorithm": ALGORITHMS[method], "evaluated": EVALUATED[method],
            "stamen-config": stamen_config(method, seed=0, rounds=args.rounds, every=args.every),
            "accuracy": curve_rows(log, args, method, "accuracy"),
            "accuracy-client-mean": curve_rows(log, args, method, "accuracy-client-mean"),
            "same-clients": all(r.get("fingerprint-matches") for r in done) if done else None,
            "wall-seconds": {system: [round(r["wall-seconds"]) for r in done if r["system"] == system]
                             for system in SYSTEMS},
        }  # fmt: skip
        if method == "fedproto":
            methods[method]["pfllib-prototype-accuracy"] = [
                {"round": f["round"], **{str(r["seed"]): 100 * f["prototype-accuracy"]}}
                for r in done if r["system"] == "pfllib" for f in r["figures"]
            ]  # fmt: skip
    read: dict[int, set[str]] = {}
    for run in logged:  # from the runs, not the cache's export: what each system read, also once the export is gone
        read.setdefault(run["seed"], set()).add(run["read-fingerprint"])
    fingerprints = {seed: hashes.pop() if len(hashes) == 1 else sorted(hashes) for seed, hashes in read.items()}
    return {"benchmark": "B8 parity with PFLlib", "pfllib": {"url": "https://github.com/TsingZ0/PFLlib",
            "commit": PFLLIB_COMMIT}, "budget": PFLLIB_DEFAULTS, "clients": CLIENTS, "rounds": args.rounds,
            "every": args.every, "seeds": args.seeds, "client-fingerprints": fingerprints, **stamp(),
            "methods": methods}  # fmt: skip


def noise_word(within: bool | None) -> str:
    """A table's verdict: yes / no, or n/a where fewer than two seeds are paired."""
    return "n/a" if within is None else "yes" if within else "no"


def markdown(report: dict) -> str:
    lines = [f"# B8 beside PFLlib's own code ({report['date']}, {report['machine']})", "",
             f"PFLlib {report['pfllib']['commit'][:12]} ({report['pfllib']['url']}), unchanged; both systems on the "
             f"same {report['clients']} clients (stamen's `pfllib-practical` split of CIFAR-10, exported in PFLlib's "
             f"format), PFLlib's defaults: batch {report['budget']['batch-size']}, lr {report['budget']['lr']}, "
             f"{report['budget']['local-epochs']} local epoch, every client every round, FedAvgCNN; seeds "
             f"{report['seeds']}. Accuracy (%) is correct over all the clients' test examples (PFLlib's own figure), "
             "mean over the seeds ± 95% half-width; the gap is stamen - PFLlib, paired by seed (same clients and "
             "seed offset).", "", "Client fingerprints (SHA-256 of every client's arrays, per seed): " +
             ", ".join(f"seed {s} `{h[:16]}`" for s, h in report["client-fingerprints"].items()), ""]  # fmt: skip
    for method, row in report["methods"].items():
        lines += [f"## {method} (PFLlib's {row['pfllib-algorithm']})", "", f"Evaluated: {row['evaluated']}. Same "
                  f"clients in every run: {row['same-clients']}. Run seconds: stamen {row['wall-seconds']['stamen']}, "
                  f"PFLlib {row['wall-seconds']['pfllib']}.", "",
                  "| round | stamen | PFLlib | gap (paired) | within the seeds' noise | client mean: stamen | "
                  "PFLlib |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for weighted, mean in zip(row["accuracy"], row["accuracy-client-mean"], strict=True):
            lines.append(f"| {weighted['round']} | {fmt(weighted.get('stamen'), weighted.get('stamen-ci95'))} | "
                         f"{fmt(weighted.get('pfllib'), weighted.get('pfllib-ci95'))} | "
                         f"{fmt(weighted.get('gap'), weighted.get('gap-ci95'))} | "
                         f"{noise_word(weighted.get('within-noise'))} | {fmt(mean.get('stamen'))} | "
                         f"{fmt(mean.get('pfllib'))} |")  # fmt: skip
        if "pfllib-prototype-accuracy" in row:
            protos = row["pfllib-prototype-accuracy"]
            lines += ["", "PFLlib's own FedProto figure (nearest global prototype): " +
                      ", ".join(f"round {p['round']} seed {s}: {v:.1f}" for p in protos for s, v in p.items()
                                if s != "round")]  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = arguments(__doc__, out="pfllib_parity.json", quick="one round of FedAvg, seed 0", report_only=True,
                       redirect=("out", "log"))  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pfllib", type=Path, help="a clone of PFLlib holding its pinned commit (default: clone it)")
    parser.add_argument("--python", help="a Python with PFLlib's imports (default: a venv made under the cache)")
    parser.add_argument("--log", type=Path, default=RESULTS / "pfllib_parity_runs.jsonl")
    parser.add_argument("--method", help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stamen-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pfllib-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pfllib_worker or args.stamen_worker:
        run = run_pfllib if args.pfllib_worker else stamen_run
        where = {"root": args.pfllib_worker, "clients": CLIENTS} if args.pfllib_worker else {}
        result = run(**where, method=args.method, seed=args.seed, rounds=args.rounds, every=args.every)
        args.worker_out.write_text(json.dumps(result))
        return
    if args.quick:
        args.seeds, args.methods, args.rounds, args.every = [0], ["fedavg"], 1, 1
    log = RunLog(path=args.log, key_fields=KEY_FIELDS)
    if not args.report_only:
        root = checkout(args.pfllib)
        args.python = pfllib_python(args.python)
        run_jobs(args, root, log)
    report = report_of(log, args)
    write_report(args.out, report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
