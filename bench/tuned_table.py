"""Benchmark B9: every method tuned on the same budget, beside B7's shared setting.

B7 runs each method at one shared setting. This gives each method the same search
budget over its own keys and its step size, scored on a validation split, then runs the
winner on the test split:

1. **Search** (seed 0, ``validation-fraction`` = ``VALIDATION``): ``CONFIGS`` configurations per
   method. The first is B7's shared setting; the rest are a scrambled Sobol sequence (seeded,
   ``torch.quasirandom``) over the method's ``SPACES``: the step size log-uniform over
   ``LR_RANGE``, each own key over the range given with its reason. A configuration's
   score is the client-mean personalised accuracy on the validation split (a seeded share
   of each client's training data; the test split is never read) after B7's rounds. A run
   whose train loss stays non-finite for ``DIVERGED_ROUNDS`` rounds stops there and scores
   nothing.
2. **Test**: the best-scoring configuration, with seeds 0, 1 and 2 on the whole training
   data, tested on the test split as B7 tests.

Runs are driven in this process (``app/local/inprocess.py``: the same strategy and client code
and the same iterates as ``flwr run`` for the same seed), one thread each, ``--workers`` side
by side; each appends to ``bench/results/tuned_table_runs.jsonl`` and is skipped when asked
for again, so the benchmark can be stopped and resumed. The report
(``bench/results/tuned_table.{json,md}``) puts each method's tuned accuracy beside its B7
row (``personalised_table.json``) with the chosen configuration and every search score.

    python -m bench.tuned_table --quick                  # 2 configs of 3 methods, 5 rounds, embedded data
    python -m bench.tuned_table --datasets femnist       # search and test on one dataset
    python -m bench.tuned_table --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path

from bench.harness import (
    REPO,
    RESULTS,
    SHARED_DATA,
    RunLog,
    arguments,
    fmt,
    interval,
    script_command,
    stamp,
    write_report,
)
from bench.personalised_setup import (
    B7_METHODS,
    B7_RESULTS,
    CONFIGS,
    DATASETS,
    DIVERGED_ROUNDS,
    LR_RANGE,
    SEARCH_SEED,
    SPACES,
    TEST_SEEDS,
    TUNED_KEY_FIELDS,
    VALIDATION,
    image_folder,
    keys_of,
    selftuned_keys,
    tuned_run_config,
)


def one_run(config: dict, clients: int, rounds: int) -> dict:
    """A run in this process; its final evaluation, or where it diverged."""
    from app.local.inprocess import InProcessRun

    started = time.perf_counter()
    run = InProcessRun(run_config=config, num_clients=clients)
    visits = count_visits(run)
    losses, grad_evals, non_finite = [], 0, 0
    for _ in range(rounds):
        metrics = run.step()
        loss = metrics.get("train-loss")
        losses.append(loss)
        grad_evals += metrics.get("grad-evals", 0) + metrics.get("hvp-evals", 0)
        non_finite = non_finite + 1 if loss is None or not math.isfinite(loss) else 0
        if non_finite >= DIVERGED_ROUNDS:
            return {"status": "diverged", "diverged-at": run.round, "train-loss-curve": losses,
                    "grad-evals": grad_evals, "wall-seconds": time.perf_counter() - started}  # fmt: skip
    final = run.evaluate()
    tuner = run.strategy.tuner
    return {"status": "completed", "accuracy": final.get("accuracy-client-mean"),
            "global-accuracy": final.get("global-accuracy-client-mean"), "grad-evals": grad_evals,
            "tuned-values": tuner.values() if tuner is not None else None, "train-loss-curve": losses,
            "visits": {"min": min(visits), "median": statistics.median(visits), "max": max(visits)},
            "wall-seconds": time.perf_counter() - started}  # fmt: skip


def count_visits(run) -> list[int]:
    """Each client's fit calls so far, counted as the run goes (what its personal state trained on)."""
    visits = [0] * len(run.clients)
    for index, client in enumerate(run.clients):

        def fit(parameters, config, index=index, answer=client.fit):
            visits[index] += 1
            return answer(parameters, config)

        client.fit = fit
    return visits


PHASES = ("search", "test", "self-tuned", "all-clients")
GAP = 5.0  # points under tuned FedAvg + update past which a method's gap is measured (the all-clients run)
# methods whose every-client run also goes at B7's shared setting (config 0) when the search chose another: issue 39
# asks why SCAFFOLD diverged at B7's lr 0.1 on FEMNIST, so its run there separates visits from the step size
ALSO_AT_B7 = ("scaffold",)


def best_config(log: RunLog, dataset: str, method: str, rounds: int, configs: int) -> int | None:
    """The index of the search's best-scoring configuration; None until every one of ``configs`` has run."""
    scores = []
    for index in range(configs):
        result = log.get({"dataset": dataset, "method": method, "phase": "search", "config": index,
                          "seed": SEARCH_SEED, "rounds": rounds})  # fmt: skip
        if result is None:
            return None
        scores.append(score_of(result))
    return max(range(configs), key=lambda i: (scores[i], -i))  # a tie goes to the earlier (B7's first)


def score_of(result: dict) -> float:
    accuracy = result.get("accuracy")
    return accuracy if result["status"] == "completed" and accuracy is not None and math.isfinite(accuracy) else -1.0


def jobs(log: RunLog, args: argparse.Namespace, phase: str) -> list[dict]:
    """The phase's runs on every dataset asked for (a test run only once its method's search is complete)."""
    out = []
    for dataset in args.datasets:
        gaps = large_gaps(log, dataset, args) if phase == "all-clients" else []
        for method in args.methods:
            base = {"dataset": dataset, "method": method, "phase": phase, "rounds": args.rounds[dataset]}
            if phase == "search":
                out += [{**base, "config": i, "seed": SEARCH_SEED} for i in range(args.configs)]
            elif phase == "test":
                best = best_config(log, dataset, method, args.rounds[dataset], args.configs)
                out += [] if best is None else [{**base, "config": best, "seed": s} for s in args.seeds]
            elif phase == "self-tuned" and selftuned_keys(method, dataset) is not None:
                out += [{**base, "config": -1, "seed": s} for s in args.seeds]
            elif phase == "all-clients" and method in gaps:
                best = best_config(log, dataset, method, args.rounds[dataset], args.configs)
                configs = [best, 0] if method in ALSO_AT_B7 and best != 0 else [best]
                out += [{**base, "config": config, "seed": SEARCH_SEED} for config in configs]
    return out


def tested_mean(log: RunLog, dataset: str, method: str, args: argparse.Namespace) -> float | None:
    """The winner's mean test accuracy (%) over the seeds, once every seed has completed."""
    best = best_config(log, dataset, method, args.rounds[dataset], args.configs)
    if best is None:
        return None
    base = {"dataset": dataset, "method": method, "phase": "test", "config": best, "rounds": args.rounds[dataset]}
    runs = [log.get({**base, "seed": seed}) for seed in args.seeds]
    done = [r["accuracy"] for r in runs if r and r["status"] == "completed" and r.get("accuracy") is not None]
    return 100 * statistics.mean(done) if len(done) == len(runs) else None


def large_gaps(log: RunLog, dataset: str, args: argparse.Namespace) -> list[str]:
    """The methods whose tuned test accuracy is more than ``GAP`` points under tuned FedAvg + update's."""
    fedavg = tested_mean(log, dataset, "fedavg", args)
    if fedavg is None:
        return []
    means = {m: tested_mean(log, dataset, m, args) for m in args.methods if m != "fedavg"}
    return [m for m, mean in means.items() if mean is not None and mean < fedavg - GAP]


def claims_dir(args: argparse.Namespace) -> Path:
    """Where workers claim their runs: one empty file per run, beside the run log (git-ignored)."""
    return args.log.parent / ".tuned_table_claims"


def worker(args: argparse.Namespace) -> None:
    """Claim and run the phase's jobs one at a time (a claim is a file, so workers never repeat a run)."""
    log = RunLog(path=args.log, key_fields=TUNED_KEY_FIELDS)
    folder = image_folder(args.folder_cache) if "mnist-folder-dirichlet" in args.datasets else None
    claims = claims_dir(args)
    for job in jobs(log, args, args.phase):
        claim = claims / log.key(job).replace("|", "_")
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        if RunLog(path=args.log, key_fields=TUNED_KEY_FIELDS).get(job) is not None:
            continue
        keys = keys_of(job)
        data = DATASETS[job["dataset"]]
        validation = VALIDATION if job["phase"] == "search" else 0.0
        config = tuned_run_config(job["dataset"], job["method"], keys, seed=job["seed"], rounds=job["rounds"],
                            validation=validation, folder=folder)  # fmt: skip
        try:
            result = one_run(config, data.clients, job["rounds"])
        except Exception as err:  # a failing configuration is a row of the report, not the end of the table
            result = {"status": f"failed: {type(err).__name__}: {err}"}
        result = {**job, "keys": keys, "validation-fraction": validation, **result}
        log.append(result)
        acc = result.get("accuracy")
        print(f"[worker {args.worker}] {job['dataset']} {job['method']} {job['phase']} config {job['config']} seed "
              f"{job['seed']}: {result['status']}, acc {'n/a' if acc is None else f'{100 * acc:.1f}'} "
              f"({result.get('wall-seconds', 0):.0f} s)", flush=True)  # fmt: skip


def run_phase(args: argparse.Namespace, phase: str) -> None:
    """``--workers`` processes of one thread each over the phase's jobs; wait for them."""
    claims = claims_dir(args)
    claims.mkdir(parents=True, exist_ok=True)
    for stale in claims.iterdir():  # a claim outlives a stopped worker; what the log holds is what ran
        stale.unlink()
    command = [*script_command(__file__), "--phase", phase, "--log", str(args.log), "--folder-cache",
               str(args.folder_cache), "--configs", str(args.configs), "--datasets", *args.datasets,
               "--methods", *args.methods, "--seeds", *map(str, args.seeds)]  # fmt: skip
    if args.quick:
        command.append("--quick")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    workers = [subprocess.Popen([*command, "--worker", str(i)], env=env, cwd=REPO) for i in range(args.workers)]
    codes = [w.wait() for w in workers]
    if any(codes):
        raise SystemExit(f"B9: a worker exited with {codes}")


def keys_text(method: str, keys: dict) -> str:
    """The searched keys and the step size, as a run-config fragment."""
    dims, _ = SPACES[method]
    shown = ["lr", *(d.key for d in dims), *(["tune"] if "tune" in keys else [])]
    shown = [k for k in shown if k in keys]
    return " ".join(f"{k}={keys[k]:.3g}" if isinstance(keys[k], float) else f"{k}={keys[k]}" for k in shown)


def report_of(log: RunLog, args: argparse.Namespace) -> dict:
    """Per dataset and method: B7's row, every search score, the winner's test seeds, the self-tuned seeds."""
    b7 = json.loads(B7_RESULTS.read_text())["datasets"] if B7_RESULTS.exists() else {}
    out = {}
    for dataset in args.datasets:
        rounds, rows = args.rounds[dataset], {}
        for method in args.methods:
            base = {"dataset": dataset, "method": method, "rounds": rounds}

            def find(phase: str, config: int, seed: int, base: dict = base) -> dict | None:
                return log.get({**base, "phase": phase, "config": config, "seed": seed})

            search = [find("search", i, SEARCH_SEED) for i in range(args.configs)]
            row = {"b7": b7.get(dataset, {}).get("methods", {}).get(method) if not args.quick else None,
                   "search": [None if r is None else {"keys": keys_text(method, r["keys"]), "status": r["status"],
                                                      "score": r.get("accuracy") and 100 * r["accuracy"],
                                                      "grad-evals": r.get("grad-evals")} for r in search]}  # fmt: skip
            best = best_config(log, dataset, method, rounds, args.configs)
            if best is not None:
                tests = [find("test", best, s) for s in args.seeds]
                validation = 100 * search[best]["accuracy"] if score_of(search[best]) >= 0 else None
                chosen = keys_text(method, search[best]["keys"])
                row["chosen"] = {"config": best, "keys": chosen, "validation": validation}
                row["test"] = seeds_summary(tests, args.seeds)
                row["search-grad-evals"] = sum(r.get("grad-evals") or 0 for r in search)
                row["visits"] = next((r["visits"] for r in tests if r and "visits" in r), None)
                for name, config in (("all-clients", best), ("all-clients-at-b7", 0 if best != 0 else None)):
                    every = None if config is None else find("all-clients", config, SEARCH_SEED)
                    if every is not None:
                        row[name] = {"status": every["status"], "visits": every.get("visits"),
                                     "accuracy": every.get("accuracy") and 100 * every["accuracy"],
                                     "wall-seconds": every.get("wall-seconds")}  # fmt: skip
            selftuned = [find("self-tuned", -1, s) for s in args.seeds]
            if any(selftuned):
                row["self-tuned"] = seeds_summary(selftuned, args.seeds)
                row["self-tuned"]["grad-evals"] = statistics.mean(r.get("grad-evals") or 0 for r in selftuned if r)
            rows[method] = row
        if "fedavg" in rows:
            for row in rows.values():
                row["gap-to-fedavg"] = paired_gap(rows["fedavg"].get("test"), row.get("test"))
                row["self-tuned-gap"] = paired_gap(row.get("test"), row.get("self-tuned"))
        out[dataset] = {"label": DATASETS[dataset].label, "rounds": rounds, "methods": rows}
    return out


def seeds_summary(results: list[dict | None], seeds: list[int]) -> dict:
    """Test accuracy (%) per seed, with the mean and 95% half-width once every seed completed."""
    per_seed = {s: 100 * r["accuracy"] for s, r in zip(seeds, results, strict=True)
                if r and r["status"] == "completed" and r.get("accuracy") is not None}  # fmt: skip
    summary = {"per-seed": per_seed, "statuses": [r["status"] if r else "not run" for r in results]}
    if len(per_seed) == len(seeds):
        summary["accuracy"], summary["ci95"] = interval(list(per_seed.values()))
    return summary


def paired_gap(low: dict | None, high: dict | None) -> tuple[float, float] | None:
    """``high`` minus ``low`` (points), mean and 95% half-width over the seeds both completed."""
    if not low or not high:
        return None
    seeds = sorted(set(low["per-seed"]) & set(high["per-seed"]))
    return interval([high["per-seed"][s] - low["per-seed"][s] for s in seeds]) if seeds else None


def markdown(report: dict) -> str:
    lines = [f"# B9: every method tuned on the same budget ({CONFIGS} configurations, validation split "
             f"{VALIDATION:g} of each client's training data, seed {SEARCH_SEED}; the winner on the test split, seeds "
             f"{list(report['seeds'])})", ""]  # fmt: skip
    for block in report["datasets"].values():
        lines += [f"## {block['label']}: {block['rounds']} rounds", "",
                  "| method | B7 shared setting (%) | tuned (%, 95% CI) | tuned - FedAvg tuned (seed-paired) | "
                  "chosen configuration | its validation score | self-tuned from B7's setting (%) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        ranked = sorted(block["methods"].items(), key=lambda kv: -(kv[1].get("test", {}).get("accuracy") or -1))
        for method, row in ranked:
            b7 = row.get("b7") or {}
            test = row.get("test") or {}
            gap = row.get("gap-to-fedavg")
            chosen = row.get("chosen") or {}
            selftuned = row.get("self-tuned") or {}
            lines.append(f"| {method} | {fmt(b7.get('accuracy'), b7.get('ci95'))} | "
                         f"{fmt(test.get('accuracy'), test.get('ci95'))} | "
                         f"{'n/a' if gap is None or method == 'fedavg' else fmt(*gap)} | "
                         f"`{chosen.get('keys', 'search incomplete')}` | {fmt(chosen.get('validation'))} | "
                         f"{fmt(selftuned.get('accuracy'), selftuned.get('ci95'))} |")  # fmt: skip
        gaps = [(m, r) for m, r in block["methods"].items() if r.get("all-clients")]
        if gaps:
            lines += ["", f"More than {GAP:g} points under tuned FedAvg + update, and the cause removed (seed "
                      f"{SEARCH_SEED}, the chosen configuration with every client every round):", "",
                      "| method | tuned, seed 0 (%) | visits per client in the tuned run (min / median / max) | "
                      "all clients every round (%) | the same at B7's shared setting (%) |",
                      "|---|---|---|---|---|"]  # fmt: skip
            for method, row in gaps:
                visits = row.get("visits") or {}
                seed0 = (row.get("test") or {}).get("per-seed", {}).get(SEARCH_SEED)
                at_b7 = "(chosen)" if row["chosen"]["config"] == 0 else "not run"
                outcomes = [fmt(every["accuracy"]) if every["status"] == "completed" else every["status"]
                            for every in (row["all-clients"], row.get("all-clients-at-b7"))
                            if every is not None] + [at_b7]  # fmt: skip
                lines.append(f"| {method} | {fmt(seed0)} | {visits.get('min')} / {visits.get('median')} / "
                             f"{visits.get('max')} | {outcomes[0]} | {outcomes[1]} |")  # fmt: skip
        lines += ["", "Every search score (validation accuracy, %; config 0 is B7's shared setting):", ""]
        for method, row in block["methods"].items():
            scores = ", ".join("not run" if r is None else f"{r['keys']}: "
                               + (fmt(r["score"]) if r["status"] == "completed" else r["status"])
                               for r in row["search"])  # fmt: skip
            lines.append(f"- `{method}`: {scores}")
        lines.append("")
    lines += ["Search spaces (the step size log-uniform over "
              f"{LR_RANGE[0]}-{LR_RANGE[1]} for every method, then):", ""]  # fmt: skip
    lines += [f"- `{m}`: {why}" for m, (_, why) in SPACES.items() if m in report["methods"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    from app.registry import METHODS

    parser = arguments(__doc__, quick="2 configs of fedavg, fedprox and ditto, 5 rounds, one seed, the embedded data",
                       report_only=True, redirect=("log",))  # fmt: skip
    parser.add_argument("--datasets", nargs="+", default=["femnist", "mnist-folder-dirichlet"], choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(B7_METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(TEST_SEEDS))
    parser.add_argument("--configs", type=int, default=CONFIGS)
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--workers", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--folder-cache", type=Path, default=Path.home() / ".cache" / "stamen" / "b7-mnist-10k-folder")
    parser.add_argument("--log", type=Path, default=RESULTS / "tuned_table_runs.jsonl")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # a worker's
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.datasets, args.methods, args.seeds, args.configs = ["mnist-paper"], ["fedavg", "fedprox", "ditto"], [0], 2
    args.rounds = {d: 5 if args.quick else DATASETS[d].rounds for d in args.datasets}
    unknown = [m for m in args.methods if m not in SPACES]
    if unknown:
        raise SystemExit(f"B9 has no search space for {unknown}; methods with one: {sorted(SPACES)}")
    needed = [DATASETS[d].needs for d in args.datasets if DATASETS[d].needs]
    missing = [folder for folder in needed if not (SHARED_DATA / folder).exists()]
    if missing:
        raise SystemExit(f"B9 needs {missing} under {SHARED_DATA}; leave those datasets out with --datasets")
    if args.worker is not None:
        return worker(args)
    if not args.report_only:
        for phase in args.phases:
            run_phase(args, phase)
    log = RunLog(path=args.log, key_fields=TUNED_KEY_FIELDS)
    report = {"benchmark": "B9", "quick": args.quick, "seeds": args.seeds, "configs": args.configs,
              "validation-fraction": VALIDATION, "lr-range": LR_RANGE, "methods": args.methods,
              "spaces": {m: SPACES[m][1] for m in args.methods}, **stamp(),
              "run-minutes": sum(r.get("wall-seconds", 0) for r in log.results.values()) / 60,
              "datasets": report_of(log, args)}  # fmt: skip
    write_report(args.log.with_name("tuned_table.json"), report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
