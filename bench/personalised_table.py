"""Benchmark B7: every registered method on three non-IID datasets, personalised accuracy and what it costs.

Each registered method runs through Flower's simulation engine (a private local
SuperLink, one CPU per client) on three datasets, for the seeds asked:

- ``mnist-paper``: the embedded ``mnist-5k`` with the Per-FedAvg paper's split (the main
  job's data: 50 users, a = 8), the MLP;
- ``femnist``: ``../shared/data/femnist-leaf``, the natural split (105 writers), ``cnn-small``;
- ``mnist-folder-dirichlet``: ``../shared/data/mnist-10k`` written once as an image folder
  (``train/<digit name>/*.png``, ``test/...``, by ``datasets.tools.device_folders.write_split``,
  into ``--folder-cache``) and read as a user's own data (``dataset = "imagefolder"``), split
  over 50 users by a Dirichlet(0.1) draw over classes (strong label skew; each user's test
  split follows its own mix), the MLP;
- ``mnist-pathological``: PFLlib's setting as near as 2 cores allow, for its five methods
  only: ``../shared/data/mnist-10k`` (no FMNIST here) over 20 users of 2 classes each
  (``shards``), every user training every round, the MLP; it asks whether the published
  ordering appears where the published conditions hold.

The shared keys are equal across methods on a dataset (``SHARED``, with a dataset's own
``shared``: FEMNIST takes B2's tuned lr 0.1 and batch 16); each method's own keys are at
the values ``METHOD_KEYS`` gives, with the reason, and :func:`own_keys` ties the step sizes
it names to the shared lr (all in ``bench/personalised_setup.py``, which B9 shares). For every run it records the
client-mean personalised accuracy after the last round, the global model's accuracy on
the same splits where the method has a global model, seconds per round, gradient
evaluations per round and the bytes of arrays sent and received per round, and writes
``bench/results/personalised_table.json`` and ``.md``: per dataset and method the mean with
a 95% t-interval over seeds, the costs' medians, and how the ordering compares with
PFLlib's published one.

    python -m bench.personalised_table --quick             # one seed, mnist-paper, 10 rounds
    python -m bench.personalised_table                     # the table in docs/benchmarks.md (3 seeds)
    python -m bench.personalised_table --report-only       # rebuild the report from the run log

Finished runs are appended to ``bench/results/personalised_table_runs.jsonl`` and skipped
when asked for again, so the benchmark can be stopped and resumed.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from app.registry import METHODS
from bench.harness import (
    SHARED_DATA,
    RunLog,
    arguments,
    fmt,
    interval,
    local_simulation,
    read_records,
    stamp,
    write_report,
)
from bench.personalised_setup import (
    DATASETS,
    METHOD_KEYS,
    PUBLISHED,
    PUBLISHED_ORDER,
    SHARED,
    image_folder,
    personalised_run_config,
)

KEY_FIELDS = ("dataset", "method", "seed", "rounds")


def summarise_run(run_dir: Path, method: str) -> dict:
    """The last evaluation's client-mean accuracies, and the cost per round (a fit round's median seconds)."""
    rounds, summary = read_records(run_dir)
    final = summary["final"]
    per_round = len(rounds)
    training_only = [r["round-seconds"] for r in rounds if "accuracy" not in r] or [r["round-seconds"] for r in rounds]
    has_global = "global-accuracy-client-mean" in final and method != "diffusion"  # diffusion: each agent's own
    return {
        "status": summary["status"],
        "accuracy": final.get("accuracy-client-mean"),
        "accuracy-weighted": final.get("accuracy"),
        "global-accuracy": final["global-accuracy-client-mean"] if has_global else None,
        "curve": [(r["round"], r["accuracy-client-mean"]) for r in rounds if "accuracy-client-mean" in r],
        "seconds-per-round": statistics.median(training_only),  # a round without evaluation
        "seconds-to-round-1": summary["timing"].get("first-round-start-seconds"),
        "grad-evals-per-round": sum(r.get("grad-evals", 0) for r in rounds) / per_round,
        "bytes-sent-per-round": sum(r.get("fit-bytes-sent", 0) for r in rounds) / per_round,
        "bytes-received-per-round": sum(r.get("fit-bytes-received", 0) for r in rounds) / per_round,
        "eval-bytes-sent": sum(r.get("eval-bytes-sent", 0) for r in rounds),
        "failed-replies": summary["clients-failed"],
    }


COSTS = ("seconds-per-round", "grad-evals-per-round", "bytes-sent-per-round", "bytes-received-per-round")


def report_of(runs: list[dict], datasets: list[str], seeds: list[int], rounds: dict[str, int]) -> dict:
    """Per dataset and method: accuracy mean and 95% half-width over seeds, global accuracy, median costs."""
    table = {}
    for name in datasets:
        methods = {}
        for method in METHODS:
            done = [r for r in runs if r["dataset"] == name and r["method"] == method and r["seed"] in seeds
                    and r["rounds"] == rounds[name] and r.get("accuracy") is not None]  # fmt: skip
            if not done:
                continue
            mean, half = interval([100 * r["accuracy"] for r in done])
            globals_ = [100 * r["global-accuracy"] for r in done if r["global-accuracy"] is not None]
            g_mean, g_half = interval(globals_) if globals_ else (None, None)
            methods[method] = {"accuracy": mean, "ci95": half, "seeds": sorted(r["seed"] for r in done),
                               "per-seed": [100 * r["accuracy"] for r in sorted(done, key=lambda r: r["seed"])],
                               "global-accuracy": g_mean, "global-ci95": g_half,
                               **{k: statistics.median(r[k] for r in done) for k in COSTS}}  # fmt: skip
        table[name] = {"label": DATASETS[name].label, "rounds": rounds[name], "clients": DATASETS[name].clients,
                       "per-round": DATASETS[name].per_round,
                       "lr": DATASETS[name].lr(), "shared": {**SHARED, **DATASETS[name].shared},
                       "model": DATASETS[name].model, "methods": methods, "ordering": ordering(methods)}  # fmt: skip
    return table


def ordering(methods: dict) -> dict:
    """Our order of PFLlib's five methods, and which of its published pairwise orders hold here.

    A pair is compared seed by seed (a seed fixes the split and the sampling for every
    method): ``gap`` is the mean of higher - lower over the seeds both ran, ``ci95`` its
    t-interval's half-width, and ``separated`` whether that interval leaves out 0.
    """
    ranked = sorted((m for m in PUBLISHED if m in methods), key=lambda m: methods[m]["accuracy"])
    pairs = []
    for i, low in enumerate(PUBLISHED_ORDER):
        for high in PUBLISHED_ORDER[i + 1 :]:
            if low not in methods or high not in methods or PUBLISHED[low] >= PUBLISHED[high]:
                continue
            lows, highs = (dict(zip(methods[m]["seeds"], methods[m]["per-seed"], strict=True)) for m in (low, high))
            gap, half = interval([highs[seed] - lows[seed] for seed in sorted(set(lows) & set(highs))])
            pairs.append({"lower": low, "higher": high, "holds": gap > 0, "gap": gap, "ci95": half,
                          "separated": abs(gap) > half > 0})  # fmt: skip
    return {"ours": ranked, "published": PUBLISHED_ORDER, "pairs": pairs}


def markdown(report: dict) -> str:
    lines = [f"# B7: a personalised-FL table on Flower ({len(report['seeds'])} seed(s): {report['seeds']})", ""]
    for table in report["datasets"].values():
        lines += [f"## {table['label']}: {table['model']}, {table['rounds']} rounds, about {table['per-round']} of "
                  f"{table['clients']} clients a round, lr {table['lr']}", "",
                  "| method | personalised acc. (%, client mean, 95% CI) | global model acc. (%) | s / round | "
                  "grad. evals / round | MB sent / round | MB received / round |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for method, row in sorted(table["methods"].items(), key=lambda item: -item[1]["accuracy"]):
            tested = "n/a"
            if row["global-accuracy"] is not None:
                tested = f"{row['global-accuracy']:.1f} ± {row['global-ci95']:.1f}"
            lines.append(
                f"| {method} | {row['accuracy']:.1f} ± {row['ci95']:.1f} | {tested} | {row['seconds-per-round']:.2f} | "
                f"{row['grad-evals-per-round']:.0f} | {row['bytes-sent-per-round'] / 1e6:.2f} | "
                f"{row['bytes-received-per-round'] / 1e6:.2f} |"
            )
        order = table["ordering"]
        held = [p for p in order["pairs"] if p["holds"]]
        reversed_ = [f"{p['lower']} > {p['higher']} by {-p['gap']:.1f} ± {p['ci95']:.1f}" for p in order["pairs"]
                     if not p["holds"] and p["separated"]]  # fmt: skip
        lines += ["", f"PFLlib's order, lowest first: {' < '.join(order['published'])}; here: "
                  f"{' < '.join(order['ours'])}. Published pairs that hold here: {len(held)} of {len(order['pairs'])}"
                  f", {sum(p['separated'] for p in held)} of them with the seed-paired 95% interval of the gap "
                  f"above 0" + (f"; reversed beyond the interval: {', '.join(reversed_)}" if reversed_ else "") + ".",
                  ""]  # fmt: skip
    lines += ["Global model accuracy: the model each client receives, tested un-adapted on its own test split "
              "(client mean); n/a where there is no global model to test (FedRep and FedPer keep their heads at "
              "home; a diffusion agent tests its own model). Bytes: the arrays of the fit instructions and replies "
              "of a round, over every sampled client.", "", "Each method's own keys:", ""]  # fmt: skip
    lines += [f"- `{m}`: {METHOD_KEYS.get(m, ({}, 'its defaults'))[1]}" for m in METHODS]
    lines += ["", f"Shared keys: {json.dumps(SHARED)} (FEMNIST: lr 0.1, batch 16, B2's tuned FedAvg); "
              f"{report['federation']}. Machine: {report['machine']}; {report['total-minutes']:.0f} minutes of "
              "runs."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = arguments(__doc__, out="personalised_table.json", quick="one seed, mnist-paper, 10 rounds",
                       report_only="the report from the run log, no new runs")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--federation", default="client-resources-num-cpus=1")
    parser.add_argument("--folder-cache", type=Path, default=Path.home() / ".cache" / "stamen" / "b7-mnist-10k-folder",
                        help="where the MNIST image folder is written once")
    args = parser.parse_args()
    datasets, seeds = (["mnist-paper"], args.seeds[:1]) if args.quick else (args.datasets, args.seeds)
    rounds = {name: 10 if args.quick else DATASETS[name].rounds for name in datasets}
    needed = [DATASETS[name].needs for name in datasets if DATASETS[name].needs]
    missing = [folder for folder in needed if not (SHARED_DATA / folder).exists()]
    if missing:
        raise SystemExit(f"B7 needs {missing} under {SHARED_DATA}; leave those datasets out with --datasets")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = RunLog(path=args.out.with_name(args.out.stem + "_runs.jsonl"), key_fields=KEY_FIELDS)
    previous = json.loads(args.out.read_text()) if args.report_only and args.out.exists() else {}
    started = time.perf_counter()
    folder = image_folder(args.folder_cache) if "mnist-folder-dirichlet" in datasets and not args.report_only else None
    with tempfile.TemporaryDirectory() as results, local_simulation() as sim:
        for name in datasets:
            dataset = DATASETS[name]
            for seed in seeds:
                for method in [m for m in args.methods if m in (dataset.methods or METHODS)]:
                    fields = {"dataset": name, "method": method, "seed": seed, "rounds": rounds[name]}
                    if args.report_only or log.get(fields) is not None:
                        continue
                    run_name = f"{name}-{method}-s{seed}"
                    config = personalised_run_config(method, dataset, seed=seed, rounds=rounds[name], results=results,
                                        name=run_name, folder=folder)  # fmt: skip
                    outcome = sim.run(run_config=config, num_supernodes=dataset.clients, timeout_s=3600,
                                      extra_federation=args.federation)  # fmt: skip
                    result = {**fields, "wall-seconds": outcome.wall_seconds, "flower-status": outcome.status}
                    if outcome.ok:
                        result.update(summarise_run(Path(results) / run_name, method))
                    else:
                        print(outcome.log_tail, flush=True)
                    log.append(result)
                    print(f"[{time.perf_counter() - started:6.0f} s] {name} seed {seed} {method}: "
                          f"{outcome.status}, acc {fmt(100 * result['accuracy'] if result.get('accuracy') else None)}"
                          f" ({outcome.wall_seconds:.0f} s)", flush=True)  # fmt: skip
    report = {
        "benchmark": "B7",
        "quick": args.quick,
        "seeds": seeds,
        "shared": SHARED,
        "method-keys": {m: {"keys": METHOD_KEYS.get(m, ({}, ""))[0], "why": METHOD_KEYS.get(m, ({}, ""))[1]}
                        for m in METHODS},  # fmt: skip
        "published": {"source": "PFLlib benchmark, FMNIST, pathological split, 20 clients", "accuracy": PUBLISHED},
        "federation": args.federation,
        **stamp(previous),
        "total-minutes": sum(r["wall-seconds"] for r in log.results.values()
                             if r["dataset"] in datasets and r["seed"] in seeds) / 60,  # fmt: skip
        "datasets": report_of(list(log.results.values()), datasets, seeds, rounds),
    }
    write_report(args.out, report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
