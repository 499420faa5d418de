"""Benchmark B8: CIFAR-10 from JPEG files, every method on PFLlib's two splits, beside the published table.

The field's first personalised-FL comparison (PFLlib's benchmark; FedALA, AAAI 2023,
Table 2) on stamen. The data are ``../shared/data/cifar10-jpeg`` read as a user's own
image folder (``dataset = "imagefolder"``): all 60,000 images pooled and split over 20
clients by PFLlib's rules, each client keeping 25 % of its share as its test split:

- ``pathological``: ``partitioner = "pfllib-pathological"``, 2 classes a client;
- ``practical``: ``partitioner = "pfllib-practical"``, Dirichlet(0.1) over the clients;
- ``feature-shift`` (FedBN's setting): every client all ten classes (``iid``) under a
  colour transform of its own (``feature-shift = "colour"``), ``fedavg-cnn-bn``, FedBN
  against FedAvg (its personalised column is FedAvg + one local step);
- ``perfedavg-variants``: Per-FedAvg's FO, SO and HF on the pathological split (the CNN
  is ReLU, where B6 found HF useless and SO needing its curvature bound).

Every client trains every round (PFLlib's join ratio 1), batches of 10, PFLlib's 4-layer
CNN (``fedavg-cnn``), inputs normalised per channel. PFLlib runs 2,000 rounds of one local
epoch on a GPU; on 2 CPU cores the table runs ``ROUNDS`` rounds of ``local-steps`` steps
at lr 0.05 (ten times PFLlib's 0.005, for a horizon thousands of times shorter), so it
reads as an early snapshot of the published runs, which the report says.

Runs are driven in-process (``app/local/inprocess.py``: stamen's strategy and clients through
Flower's Strategy API, without the transport), two at a time on one thread each, to fit
the table in about an hour of 2 cores. Seconds per round come from a separate timing pass
(``--timing``: one run at a time, two threads, nothing beside it), not from the table's
runs. ``--startup`` measures the start-up of a 20-client CIFAR-10 simulation through
``flwr run`` from a cold and a warm decode cache, beside the default job's.

    python -m bench.cifar_table --quick      # one seed, pathological, 3 methods, 3 rounds (minutes)
    python -m bench.cifar_table              # the table (3 seeds; resumable: finished runs are skipped)
    python -m bench.cifar_table --timing     # seconds per round, one method at a time
    python -m bench.cifar_table --startup    # cold and warm start-up through flwr run
    python -m bench.cifar_table --report-only

Writes ``bench/results/cifar_table.{json,md}``; each finished run is a line of
``bench/results/cifar_table_runs.jsonl``; ``--startup`` writes ``bench/results/cifar_startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from app.config import parse_settings
from bench.cifar_setup import (
    CIFAR,
    CLASSES,
    CLIENTS,
    CONDITIONS,
    DATA,
    ROUNDS,
    SHARED,
    method_of,
    run_config,
)
from bench.harness import (
    REPO,
    RESULTS,
    RunLog,
    arguments,
    fmt,
    interval,
    local_simulation,
    script_command,
    stamp,
    write_report,
)

STARTUP_RESULTS = RESULTS / "cifar_startup.json"


# FedALA (Zhang et al., AAAI 2023), its table of test accuracy (%) "in the pathological heterogeneous setting and
# practical heterogeneous setting", CIFAR-10 columns, mean ± std, as printed on the authors' poster (FedALAPoster.pdf in
# github.com/TsingZ0/FedALA, read at a7a9b21; the same 14 methods and 8 columns as the paper's Table 2, whose arXiv
# text was not readable here). The repo's defaults: 20 clients, all every round, batch 10, 1 local epoch, lr 0.005,
# the 4-layer CNN, best accuracy over the rounds. FedAvg and FedProx are their global models; FedAvg-C / FedProx-C
# fine-tune it locally (our fedavg / fedprox rows' personalised column). PFLlib's own leaderboard
# (pfllib.com/benchmark.html) has no CIFAR-10 column.
PUBLISHED_SOURCE = ("FedALA (Zhang et al., AAAI 2023), CIFAR-10 columns of its accuracy table as printed on the "
                    "authors' poster (github.com/TsingZ0/FedALA, FedALAPoster.pdf)")
PUBLISHED = {  # our row -> (FedALA's row, pathological, practical)
    "fedavg": ("FedAvg-C", (92.13, 0.03), (90.34, 0.01)),
    "fedprox": ("FedProx-C", (92.12, 0.03), (90.33, 0.01)),
    "perfedavg": ("Per-FedAvg", (89.63, 0.23), (87.74, 0.19)),
    "fedrep": ("FedRep", (91.93, 0.14), (90.40, 0.24)),
    "pfedme": ("pFedMe", (90.11, 0.10), (88.09, 0.32)),
    "ditto": ("Ditto", (92.39, 0.06), (90.59, 0.01)),
    "fedamp": ("FedAMP", (90.79, 0.16), (88.70, 0.18)),
}
PUBLISHED_GLOBAL = {"fedavg": ("FedAvg", (55.09, 0.83), (59.16, 0.47)),
                    "fedprox": ("FedProx", (55.06, 0.75), (59.21, 0.40))}  # fmt: skip
KEY_FIELDS = ("condition", "method", "seed", "rounds")
# methods whose clients receive no one global model: a diffusion agent's own, FedAMP's per-client mix
NO_GLOBAL_MODEL = ("diffusion", "fedamp")
COSTS = ("grad-evals-per-round", "hvp-evals-per-round", "mb-sent-per-round", "mb-received-per-round")


def one_run(condition: str, label: str, *, seed: int, rounds: int, threads: int) -> dict:
    """A run in this process: per round its seconds, gradient evaluations, bytes and train loss; the final test."""
    from app.local.inprocess import InProcessRun

    started = time.perf_counter()
    run = InProcessRun(run_config=run_config(condition, label, seed=seed, rounds=rounds, threads=threads),
                       num_clients=CLIENTS)  # fmt: skip
    setup = time.perf_counter() - started
    per_round = []
    for _ in range(rounds):
        tick = time.perf_counter()
        metrics = run.step()
        per_round.append({"seconds": time.perf_counter() - tick, "grad-evals": metrics.get("grad-evals", 0),
                          "hvp-evals": metrics.get("hvp-evals", 0), "train-loss": metrics.get("train-loss"),
                          "sent": run.bytes_sent, "received": run.bytes_received})  # fmt: skip
    tick = time.perf_counter()
    final = run.evaluate()
    failed = run.strategy.record.get("clients-failed", 0) + final.get("eval-clients-failed", 0)
    has_global = "global-accuracy-client-mean" in final and method_of(label)[0] not in NO_GLOBAL_MODEL
    return {"setup-seconds": setup, "eval-seconds": time.perf_counter() - tick,
            "accuracy": final.get("accuracy-client-mean"),
            "global-accuracy": final.get("global-accuracy-client-mean") if has_global else None,
            "train-loss-curve": [r["train-loss"] for r in per_round], "failed-replies": failed,
            "seconds-per-round": statistics.median(r["seconds"] for r in per_round),
            **{f"{k}-per-round": statistics.mean(r[k] for r in per_round) for k in ("grad-evals", "hvp-evals")},
            "mb-sent-per-round": statistics.mean(r["sent"] for r in per_round) / 1e6,
            "mb-received-per-round": statistics.mean(r["received"] for r in per_round) / 1e6}  # fmt: skip


def jobs(conditions: list[str], seeds: list[int], methods: list[str] | None) -> list[tuple[str, str, int]]:
    return [(c, m, s) for c in conditions for s in seeds for m in CONDITIONS[c].methods if not methods or m in methods]


def worker(args: argparse.Namespace) -> None:
    """Run this worker's share of the jobs (every ``--of``-th from ``--worker``), appending each to the run log."""
    log = RunLog(path=args.log, key_fields=KEY_FIELDS)
    mine = jobs(args.conditions, args.seeds, args.methods)[args.worker :: args.of]
    for condition, label, seed in mine:
        fields = {"condition": condition, "method": label, "seed": seed, "rounds": args.rounds}
        if log.get(fields) is not None:
            continue
        tick = time.perf_counter()
        try:
            result = {**fields, "status": "completed", **one_run(condition, label, seed=seed, rounds=args.rounds,
                                                                  threads=1)}  # fmt: skip
        except Exception as err:  # a failing method is a row of the report, not the end of the table
            result = {**fields, "status": f"failed: {type(err).__name__}: {err}"}
        result["wall-seconds"] = time.perf_counter() - tick
        log.append(result)
        acc = result.get("accuracy")
        print(f"[worker {args.worker}] {condition} {label} seed {seed}: {result['status']}, "
              f"acc {'n/a' if acc is None else f'{100 * acc:.1f}'} ({result['wall-seconds']:.0f} s)", flush=True)


def run_table(args: argparse.Namespace) -> None:
    """Start ``--of`` workers, one thread each, and wait for them."""
    command = [*script_command(__file__), "--log", str(args.log), "--rounds", str(args.rounds), "--of", str(args.of),
               "--seeds", *map(str, args.seeds), "--conditions", *args.conditions]  # fmt: skip
    if args.methods:
        command += ["--methods", *args.methods]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    workers = [subprocess.Popen([*command, "--worker", str(i)], env=env, cwd=REPO) for i in range(args.of)]
    codes = [w.wait() for w in workers]
    if any(codes):
        raise SystemExit(f"B8: a worker exited with {codes}")


def timing(args: argparse.Namespace, rounds: int = 4, warmup: int = 1) -> dict:
    """Seconds per round of every row, one run at a time on two threads (seed 0, after ``warmup`` rounds)."""
    from app.local.inprocess import InProcessRun

    out = {}
    for condition in ("pathological", "feature-shift", "perfedavg-variants"):
        for label in CONDITIONS[condition].methods:
            if args.methods and label not in args.methods:
                continue
            config = run_config(condition, label, seed=0, rounds=10**6, threads=0)
            run = InProcessRun(run_config=config, num_clients=CLIENTS)
            seconds = []
            for i in range(warmup + rounds):
                tick = time.perf_counter()
                run.step()
                if i >= warmup:
                    seconds.append(time.perf_counter() - tick)
            out[f"{condition}/{label}"] = statistics.median(seconds)
            print(f"timing {condition} {label}: {out[f'{condition}/{label}']:.2f} s/round", flush=True)
    return {"rounds": rounds, "warmup": warmup, "threads": "torch default (2)", "seconds-per-round": out}


def startup(rounds: int = 2, repeats: int = 3) -> dict:
    """Seconds to round 1 and wall seconds of 20-client CIFAR-10 runs (cold, then warm cache) and of the default job.

    Each case starts its own local SuperLink (fresh Ray workers, nothing in their memory);
    ``cold`` starts from an empty ``STAMEN_CACHE_DIR``, ``warm`` from the one ``cold`` filled.
    The three cases run in turn ``repeats`` times, each repeat from a new empty cache; a
    case's figures are the medians over the repeats.
    """
    from bench.harness import read_records

    cases = {"cifar-cold": True, "cifar-warm": False, "default-job": None}
    measured: dict[str, list[dict]] = {name: [] for name in cases}
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as results:
            for name, cifar in cases.items():
                config = {"num-server-rounds": rounds, "results-dir": results, "run-name": name, "eval-every": rounds}
                nodes = 50
                if cifar is not None:
                    config = {**run_config("pathological", "fedavg", seed=0, rounds=rounds, threads=1), **config}
                    nodes = CLIENTS
                with local_simulation(env={"STAMEN_CACHE_DIR": cache}) as sim:
                    outcome = sim.run(run_config=config, num_supernodes=nodes, timeout_s=1800,
                                      extra_federation="client-resources-num-cpus=1")  # fmt: skip
                if not outcome.ok:
                    raise SystemExit(f"B8 start-up: {name} ended {outcome.status}\n{outcome.log_tail}")
                records, summary = read_records(Path(results) / name)
                measured[name].append({"wall-seconds": outcome.wall_seconds,
                                       "server-start-to-round-1-seconds":
                                           summary["timing"].get("first-round-start-seconds"),
                                       "round-seconds": [r["round-seconds"] for r in records]})  # fmt: skip
                print(f"start-up {name} (repeat {repeat + 1} of {repeats}): round 1 after "
                      f"{measured[name][-1]['server-start-to-round-1-seconds']:.1f} s, "
                      f"wall {outcome.wall_seconds:.1f} s", flush=True)  # fmt: skip
    return {name: {"clients": CLIENTS if cases[name] is not None else 50, "repeats": runs,
                   **{key: statistics.median(r[key] for r in runs)
                      for key in ("wall-seconds", "server-start-to-round-1-seconds")}}
            for name, runs in measured.items()}  # fmt: skip


def channel_stats() -> dict:
    """Per-channel mean and standard deviation of the training JPEGs in [0, 1] (what INPUT_MEAN/INPUT_STD hold)."""
    from datasets import DataSpec, load_source

    source = load_source(DataSpec(name="imagefolder", data_dir=str(CIFAR), classes=tuple(CLASSES.split(",")),
                                  input_shape=(3, 32, 32)))  # fmt: skip
    x = source.train_x.astype("float64") / 255.0
    return {"mean": x.mean(axis=(0, 2, 3)).round(4).tolist(), "std": x.std(axis=(0, 2, 3)).round(4).tolist()}


def majority_floor(condition: str, seeds: list[int]) -> dict:
    """The client mean of a per-client majority-class guess (each client's most frequent training class) per seed.

    What a model that learned only its client's label counts scores on that client's test
    split: the floor a personalised accuracy is read against on a label-skew split.
    """
    import numpy as np

    from datasets import load_partition, load_source

    per_seed = []
    for seed in seeds:
        settings = parse_settings(run_config(condition, "fedavg", seed=seed, rounds=ROUNDS, threads=1))
        data, split = settings.data_spec(CLIENTS), settings.partition_spec(CLIENTS)
        source = load_source(data)
        labels = np.concatenate([source.train_y, source.test_y])
        scores = []
        for client in load_partition(data, split):
            guess = np.bincount(labels[client.train], minlength=source.num_classes).argmax()
            scores.append(float(np.mean(labels[client.test] == guess)))
        per_seed.append(100 * statistics.mean(scores))
    mean, half = interval(per_seed)
    return {"accuracy": mean, "ci95": half, "seeds": seeds, "per-seed": per_seed}


def above_floor(row: dict, floor: dict | None) -> str:
    """A row's personalised accuracy minus the majority-class floor, seed-paired (the split is the seed's)."""
    if not floor or "seeds" not in row:
        return ""
    floors = dict(zip(floor["seeds"], floor["per-seed"], strict=True))
    return fmt(*interval([a - floors[s] for s, a in zip(row["seeds"], row["per-seed"], strict=True)]))


def summary_of(runs: list[dict], condition: str, label: str, seeds: list[int], rounds: int) -> dict | None:
    """One row: accuracy mean and 95% half-width over seeds, the global model's, the per-seed values and costs."""
    mine = [r for r in runs if r["condition"] == condition and r["method"] == label and r["seed"] in seeds
            and r["rounds"] == rounds]  # fmt: skip
    done = [r for r in mine if r.get("accuracy") is not None]
    # a run whose every reply turned non-finite ends without a test: it diverged (its seed is named in the row)
    failed = [f"seed {r['seed']}: " + ("diverged (non-finite replies)" if r.get("failed-replies") else r["status"])
              for r in mine if r.get("accuracy") is None]  # fmt: skip
    if not done:
        return {"failed": failed} if failed else None
    done.sort(key=lambda r: r["seed"])
    mean, half = interval([100 * r["accuracy"] for r in done])
    globals_ = [100 * r["global-accuracy"] for r in done if r.get("global-accuracy") is not None
                and method_of(label)[0] not in NO_GLOBAL_MODEL]  # fmt: skip
    g_mean, g_half = interval(globals_) if globals_ else (None, None)
    last_loss = [r["train-loss-curve"][-1] for r in done if r["train-loss-curve"][-1] is not None]
    return {"accuracy": mean, "ci95": half, "seeds": [r["seed"] for r in done],
            "per-seed": [100 * r["accuracy"] for r in done], "global-accuracy": g_mean, "global-ci95": g_half,
            "global-per-seed": globals_, "final-train-loss": statistics.mean(last_loss) if last_loss else None,
            "train-loss-curve": [statistics.mean(c) for c in zip(*(r["train-loss-curve"] for r in done), strict=True)
                                 if None not in c],
            "failed": failed,
            "rejected-replies": {r["seed"]: r["failed-replies"] for r in done if r.get("failed-replies")},
            **{k: statistics.median(r[k] for r in done) for k in COSTS},
            "wall-seconds": statistics.median(r["wall-seconds"] for r in done)}  # fmt: skip


def paired_gap(rows: dict, low: str, high: str, column: str = "per-seed",
               low_column: str | None = None) -> tuple[float, float] | None:  # fmt: skip
    """Mean and 95% half-width over seeds of ``high - low`` (a seed fixes the split for both).

    ``low_column`` reads the lower row from another column (FedAvg's global model against FedBN).
    """
    if low not in rows or high not in rows or "seeds" not in rows[low] or "seeds" not in rows[high]:
        return None
    lows = dict(zip(rows[low]["seeds"], rows[low][low_column or column], strict=True))
    highs = dict(zip(rows[high]["seeds"], rows[high][column], strict=True))
    common = sorted(set(lows) & set(highs))
    return interval([highs[s] - lows[s] for s in common]) if common else None


def published_pairs(rows: dict, column: int) -> dict:
    """Every pair of FedALA's rows we run: does its published order hold here, and by what seed-paired gap."""
    mine = [m for m in PUBLISHED if m in rows and "accuracy" in rows[m]]
    pairs = []
    for i, a in enumerate(mine):
        for b in mine[i + 1 :]:
            low, high = sorted((a, b), key=lambda m: PUBLISHED[m][column][0])
            if PUBLISHED[low][column][0] == PUBLISHED[high][column][0]:
                continue
            gap, half = paired_gap(rows, low, high)
            pairs.append({"lower": low, "higher": high, "published-gap": PUBLISHED[high][column][0]
                          - PUBLISHED[low][column][0], "gap": gap, "ci95": half, "holds": gap > 0,
                          "separated": abs(gap) > half > 0})  # fmt: skip
    return {"pairs": pairs, "held": sum(p["holds"] for p in pairs),
            "held-separated": sum(p["holds"] and p["separated"] for p in pairs),
            "reversed-separated": sum(not p["holds"] and p["separated"] for p in pairs)}  # fmt: skip


def report_of(runs: list[dict], args: argparse.Namespace) -> dict:
    conditions = {}
    for condition in args.conditions:
        rows = {}
        for label in CONDITIONS[condition].methods:
            row = summary_of(runs, condition, label, args.seeds, args.rounds)
            if row is not None:
                rows[label] = row
        conditions[condition] = {"label": CONDITIONS[condition].label, "model": CONDITIONS[condition].model,
                                 "config": CONDITIONS[condition].config, "rows": rows}  # fmt: skip
        column = {"pathological": 1, "practical": 2}.get(condition)
        if column is not None:
            conditions[condition]["published-pairs"] = published_pairs(rows, column)
            conditions[condition]["majority-floor"] = majority_floor(condition, args.seeds)
    return conditions


def loss_points(row: dict, rounds: tuple[int, ...] = (5, 10, 20)) -> str:
    """The seed-mean train loss at a few rounds: whether a row was still learning when the short horizon ended."""
    curve = row.get("train-loss-curve", [])
    return " / ".join(f"{curve[r - 1]:.2f}" for r in rounds if r <= len(curve)) or "n/a"


def markdown(report: dict) -> str:
    seconds = report.get("timing", {}).get("seconds-per-round", {})
    lines = [f"# B8: CIFAR-10 from JPEG files, {report['clients']} clients, every one every round "
             f"({len(report['seeds'])} seeds: {report['seeds']})", "",
             f"{report['rounds']} rounds of {SHARED['local-steps']} local steps (batches of {SHARED['batch-size']}, "
             f"lr {SHARED['lr']}); personalised accuracy = client mean on each client's own test split after one "
             "local step (the methods that test a model of their own test it as it is); mean ± 95% t-interval "
             f"over seeds. Published: {PUBLISHED_SOURCE} (best over up to 2,000 rounds, mean ± std).", ""]  # fmt: skip
    for name, cond in report["conditions"].items():
        published = {"pathological": 1, "practical": 2}.get(name)
        floor = cond.get("majority-floor")
        lines += [f"## {cond['label']}: {cond['model']}", "",
                  "| method | personalised acc. (%) | above the floor (points, seed-paired) | global model acc. (%) | "
                  "published (FedALA) | train loss, rounds 5 / 10 / 20 | s / round | grad. evals / round | "
                  "MB sent / round | MB received / round |",
                  "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        ranked = sorted(cond["rows"].items(), key=lambda item: -item[1].get("accuracy", -1))
        for label, row in ranked:
            if "accuracy" not in row:
                lines.append(f"| {label} | {'; '.join(row['failed'])[:120]} | | | | | | | | |")
                continue
            pub = ""
            if published and label in PUBLISHED:
                pub = f"{PUBLISHED[label][0]} {fmt(*PUBLISHED[label][published], digits=2)}"
                if label in PUBLISHED_GLOBAL:
                    pub += f"; {PUBLISHED_GLOBAL[label][0]} {fmt(*PUBLISHED_GLOBAL[label][published], digits=2)}"
            timed = seconds.get(f"{name}/{label}") or seconds.get(f"pathological/{label}")
            note = f" ({len(row['seeds'])} seeds; {'; '.join(row['failed'])})" if row["failed"] else ""
            rejected = row.get("rejected-replies", {})
            if rejected:  # a run that finished after rounds whose replies were all non-finite (the model kept)
                counts = ", ".join(f"seed {seed}: {n}" for seed, n in rejected.items())
                note += f" (non-finite replies rejected: {counts})"
            lines.append(f"| {label} | {fmt(row['accuracy'], row['ci95'])}{note} | {above_floor(row, floor)} | "
                         f"{fmt(row['global-accuracy'], row['global-ci95'])} | {pub} | {loss_points(row)} | "
                         f"{fmt(timed, digits=2)} | "
                         f"{row['grad-evals-per-round']:.0f}"
                         + (f" + {row['hvp-evals-per-round']:.0f} HVP" if row["hvp-evals-per-round"] else "")
                         + f" | {row['mb-sent-per-round']:.1f} | {row['mb-received-per-round']:.1f} |")  # fmt: skip
        if floor:
            lines += ["", f"Floor: each client guessing its most frequent training class scores "
                      f"{fmt(floor['accuracy'], floor['ci95'])} % (client mean) on this split."]  # fmt: skip
        pairs = cond.get("published-pairs")
        if pairs:
            lines += ["", f"FedALA's pairwise orders among the rows we run: {pairs['held']} of {len(pairs['pairs'])} "
                      f"hold here, {pairs['held-separated']} of them with the seed-paired 95% interval of the gap "
                      f"above 0; {pairs['reversed-separated']} reversed beyond the interval.", "",
                      "| published lower < higher | published gap | our gap (higher - lower, seed-paired) |",
                      "|---|---|---|"]  # fmt: skip
            for p in pairs["pairs"]:
                lines.append(f"| {p['lower']} < {p['higher']} | {p['published-gap']:.2f} | "
                             f"{fmt(p['gap'], p['ci95'])}{'' if p['holds'] else ' (reversed)'} |")
        lines.append("")
    shift = report["conditions"].get("feature-shift", {}).get("rows", {})
    if "accuracy" in shift.get("fedbn", {}) and "accuracy" in shift.get("fedavg", {}):
        gaps = {column: paired_gap(shift, "fedavg", "fedbn", low_column=column)
                for column in ("per-seed", "global-per-seed")}  # fmt: skip
        lines += [f"Feature shift, FedBN minus FedAvg (seed-paired): {fmt(*gaps['global-per-seed'])} points against "
                  f"FedAvg's global model, {fmt(*gaps['per-seed'])} against FedAvg + update.", ""]  # fmt: skip
    variants = report["conditions"].get("perfedavg-variants")
    if variants and "pathological" in report["conditions"]:
        fo = report["conditions"]["pathological"]["rows"].get("perfedavg")
        rows = [("perfedavg-fo", fo or {}), *variants["rows"].items()]
        named = [f"{label.removeprefix('perfedavg-').upper()} {fmt(row.get('accuracy'), row.get('ci95'))}"
                 for label, row in rows]  # fmt: skip
        both = {**variants["rows"], "perfedavg": fo or {}}
        gaps = [f"FO - {v.upper()} {fmt(*gap)}" for v in ("so", "hf")
                if (gap := paired_gap(both, f"perfedavg-{v}", "perfedavg")) is not None]  # fmt: skip
        lines += [f"Per-FedAvg's variants on the pathological split (FO is the table's perfedavg row): "
                  f"{'; '.join(named)}. Seed-paired gaps over the seeds each finished: {'; '.join(gaps)}.",
                  ""]  # fmt: skip
    start = json.loads(STARTUP_RESULTS.read_text())["cases"] if STARTUP_RESULTS.exists() else {}
    if start:
        lines += ["Start-up through `flwr run` (the server's start to round 1, seconds): "
                  + "; ".join(f"{name} ({case['clients']} clients) {case['server-start-to-round-1-seconds']:.1f}"
                              for name, case in start.items()) + ".", ""]  # fmt: skip
    lines += [f"Shared keys: {json.dumps(SHARED)}; data: {json.dumps({**DATA, 'classes': '(the ten names)'})}. "
              f"Seconds per round: the timing pass (one run at a time, two threads); the table's runs ran two at a "
              f"time on one thread each. Machine: {report['machine']}; {report['total-minutes']:.0f} minutes of "
              f"runs (two side by side).", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = arguments(__doc__, out="cifar_table.json", quick="one seed, pathological, 3 methods, 3 rounds",
                       report_only=True)  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--methods", nargs="+", default=None, help="only these row labels")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--of", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--log", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timing", action="store_true", help="only the seconds-per-round pass")
    parser.add_argument("--startup", action="store_true", help="only the start-up measurement through flwr run")
    parser.add_argument("--repeats", type=int, default=3, help="--startup: repeats of each case (medians)")
    args = parser.parse_args()
    if not CIFAR.is_dir():
        raise SystemExit(f"B8 needs CIFAR-10 as JPEG files in {CIFAR} (../shared/data/README.md)")
    if args.quick:
        args.seeds, args.conditions, args.rounds = args.seeds[:1], ["pathological"], 3
        args.methods = args.methods or ["fedavg", "fedbn", "perfedavg"]
    args.log = args.log or args.out.with_name(args.out.stem + "_runs.jsonl")
    if args.worker is not None:
        return worker(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.timing:
        report["timing"] = timing(args)
    elif args.startup:
        measured = {"benchmark": "B8 start-up", **stamp(),
                    "what": "flwr run, 2 rounds, client-resources-num-cpus=1; server-start-to-round-1 is the server's "
                    "time from its start to round 1 (the preflight, in which every client loads its data); "
                    "medians over the repeats", "cases": startup(repeats=args.repeats)}  # fmt: skip
        write_report(STARTUP_RESULTS, measured, indent=1)
        print(json.dumps(measured, indent=1))
        return
    elif not args.report_only:
        run_table(args)
        report["channel-stats"] = channel_stats()
    runs = list(RunLog(path=args.log, key_fields=KEY_FIELDS).results.values())
    chosen = {(c, m, s) for c, m, s in jobs(args.conditions, args.seeds, args.methods)}
    report.update({
        "benchmark": "B8", "quick": args.quick, "seeds": args.seeds, "rounds": args.rounds, "clients": CLIENTS,
        "shared": SHARED, "data": DATA, "published-source": PUBLISHED_SOURCE, "published": PUBLISHED,
        "published-global": PUBLISHED_GLOBAL, **stamp(report),
        "method-keys": {label: run_config(c, label, seed=0, rounds=args.rounds, threads=1) for c in args.conditions
                        for label in CONDITIONS[c].methods if not args.methods or label in args.methods},
        "total-minutes": sum(r["wall-seconds"] for r in runs if (r["condition"], r["method"], r["seed"]) in chosen
                             and r["rounds"] == args.rounds) / 60,
        "conditions": report_of(runs, args),
    })  # fmt: skip
    write_report(args.out, report, markdown(report), indent=1)
    print(markdown(report))


if __name__ == "__main__":
    main()
