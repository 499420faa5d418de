"""Benchmark B10: FedAvg's aggregations against Byzantine clients (issue 51).

Ten clients, all of them every round, run FedAvg in this process (``app/local/inprocess.py``:
real stamen clients and strategy, Flower's message encoding byte for byte). One, two or
three of them are attackers: their reply, the message the server receives, is rewritten
by one of ``ATTACKS`` after the client has trained honestly (label flipping instead
trains on flipped labels). The attackers are the first ``k`` partitions of a permutation
drawn from the seed, so the two attackers of a seed include its one.

Each cell is one (dataset, seed, aggregation, attack, attackers) run; its clean run is
the same aggregation and seed without attackers. Recorded per cell:

- the global model's accuracy on the dataset's whole test set (the server's central
  evaluation, run once after the last round), and the honest clients' mean personalised
  and global accuracy on their own test splits (the final evaluation round; the
  attackers' own figures are left out);
- whether the global model ended non-finite (and the first round it was), or at chance:
  no better than ``CHANCE_MARGIN`` above always answering the test set's most common class;
- how many replies the server's screen rejected over the run (``clients-rejected``).

The report, ``bench/results/robust_table.md``, has one table per dataset: rows attack x
attackers, columns aggregations, each cell ``mean ± sd (seeds)`` of the global model's
accuracy and its gap to the clean run of the same aggregation and seed. The JSON beside
it (``robust_table.json``) holds every cell, is rewritten after each one, and a run that
is stopped resumes where it stopped (cells already there are not run again).

    python -m bench.robust --quick          # seed 0, MNIST, clean + every attack by 2 clients; bench/results/quick
    python -m bench.robust                  # the whole grid (see SIZING), about an hour on 2 cores
    python -m bench.robust --report-only    # re-render the .md from the JSON
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# One BLAS thread per run, set before numpy loads: the server's update-norm screen is a float64 np.dot per reply,
# and OpenBLAS's threads spinning on a busy 2-core machine made it 12x slower (13 ms a reply against 1 ms).
for _blas in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

import numpy as np  # noqa: E402  (after the BLAS threads are set)

from bench.harness import REPO, SHARED_DATA, arguments, machine, results_folder  # noqa: E402
from strategies.contracts.payload import LAYOUT, MODEL, pack, unpack  # noqa: E402

NAME = "robust_table"
CLIENTS = 10
SEEDS = (0, 1, 2)
ATTACKER_COUNTS = (1, 2, 3)
# the defences are set for the largest count measured: trimming 3 of 10 at each end, Krum assuming f = 3
TRIM_FRACTION = 0.3
KRUM_ATTACKERS = 3
AGGREGATIONS: dict[str, dict] = {
    "mean": {"aggregation": "examples"},
    "median": {"aggregation": "median"},
    "trimmed-mean": {"aggregation": "trimmed-mean", "trim-fraction": TRIM_FRACTION},
    "krum": {"aggregation": "krum", "krum-attackers": KRUM_ATTACKERS},
    "multi-krum": {"aggregation": "multi-krum", "krum-attackers": KRUM_ATTACKERS},
    "uniform": {"aggregation": "uniform"},  # not in the grid: a smoke test's second rule before the robust ones exist
}
GRID_AGGREGATIONS = ("mean", "median", "trimmed-mean", "krum", "multi-krum")
SIGN_FLIP_FACTOR = 5.0
SCALE_FACTOR = 100.0
HUGE_VALUE = 1e300
BIG_INTEGER = 2**62
NOISE_RMS_MULTIPLE = 10.0
CHANCE_MARGIN = 0.05  # "at chance": accuracy within 5 points of always answering the most common test class
ATTACKER_DRAW = 51  # mixed into the seed that picks the attackers (issue 51), so it is not the run's own stream


# --- the attacks, as pure functions of what the attacker was sent and what it trained ----------------------------


def is_float(array: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.floating)


def honest_update(sent: list[np.ndarray], honest: list[np.ndarray]) -> list[np.ndarray | None]:
    """``honest - sent`` per floating array in float64; ``None`` for the others (step counters are no update)."""
    return [np.subtract(h, s, dtype=np.float64) if is_float(h) else None for s, h in zip(sent, honest, strict=True)]


def moved(sent: list[np.ndarray], honest: list[np.ndarray], step: Callable[[np.ndarray], np.ndarray]):
    """``sent + step(update)`` per floating array, in the honest reply's dtype; other arrays as the client sent them."""
    return [h if u is None else (np.asarray(s, dtype=np.float64) + step(u)).astype(np.asarray(h).dtype)
            for s, h, u in zip(sent, honest, honest_update(sent, honest), strict=True)]  # fmt: skip


def sign_flip(sent: list[np.ndarray], honest: list[np.ndarray], *, factor: float = SIGN_FLIP_FACTOR):
    """``sent - factor * (honest - sent)``: the update reversed and enlarged."""
    return moved(sent, honest, lambda update: -factor * update)


def scaled(sent: list[np.ndarray], honest: list[np.ndarray], *, factor: float = SCALE_FACTOR):
    """``sent + factor * (honest - sent)``: the honest direction, ``factor`` times as far (model replacement)."""
    return moved(sent, honest, lambda update: factor * update)


def huge_float64(sent: list[np.ndarray], honest: list[np.ndarray], *, value: float = HUGE_VALUE):
    """Every floating array as float64 full of ``value``: finite, so only a screen of scale or dtype catches it."""
    return [np.full(np.shape(h), value, dtype=np.float64) if is_float(h) else h for h in honest]


def int64_reply(sent: list[np.ndarray], honest: list[np.ndarray], *, big: int = BIG_INTEGER):
    """The honest arrays cast to int64 (truncated), the first value of the first array ``big``."""
    arrays = [np.asarray(h).astype(np.int64) for h in honest]
    arrays[0].flat[0] = big
    return arrays


def gaussian_noise(sent: list[np.ndarray], honest: list[np.ndarray], *, rng: np.random.Generator,
                   rms_multiple: float = NOISE_RMS_MULTIPLE):  # fmt: skip
    """``sent + N(0, sigma^2)`` per coordinate, sigma = ``rms_multiple`` x the honest update's RMS over the model."""
    updates = [u for u in honest_update(sent, honest) if u is not None]
    rms = math.sqrt(sum(float(np.dot(u.ravel(), u.ravel())) for u in updates) / sum(u.size for u in updates))
    return moved(sent, honest, lambda update: rng.normal(0.0, rms_multiple * rms, size=update.shape))


def flipped_labels(labels: np.ndarray, *, num_classes: int) -> np.ndarray:
    """``y -> C - 1 - y``: the label-flipping attacker's training labels."""
    return num_classes - 1 - labels


@dataclass(frozen=True)
class Attack:
    """One attack: its reply transform (``None``: the reply as trained) and whether it trains on flipped labels."""

    label: str
    transform: Callable | None
    flips_labels: bool = False
    noisy: bool = False  # the transform takes an ``rng``


ATTACKS = {
    "sign-flip": Attack(f"sign flip x{SIGN_FLIP_FACTOR:g}", sign_flip),
    "scaling": Attack(f"scaling x{SCALE_FACTOR:g}", scaled),
    "huge-float64": Attack(f"float64 {HUGE_VALUE:g} everywhere", huge_float64),
    "int64": Attack("int64 reply, one value 2^62", int64_reply),
    "gaussian": Attack(f"Gaussian noise, sigma {NOISE_RMS_MULTIPLE:g}x update RMS", gaussian_noise, noisy=True),
    "label-flip": Attack("label flip y -> C-1-y", None, flips_labels=True),
}


def attacker_partitions(seed: int, count: int, clients: int = CLIENTS) -> list[int]:
    """The first ``count`` of a permutation of the partitions drawn from ``seed`` (nested: 2 attackers include 1's)."""
    order = np.random.default_rng([ATTACKER_DRAW, seed]).permutation(clients)
    return sorted(int(p) for p in order[:count])


# --- the runs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """One of B10's datasets: its run-config keys and rounds."""

    label: str
    config: dict
    rounds: int
    needs: str


# FEMNIST's cnn-small sits on a plateau for its first 15-20 rounds of 10 steps; 20 local steps a round reach 57 %
# (its plateau is about 60 %) in 30 rounds, half the work of 10 steps for 60 rounds
DATASETS = {
    "mnist-dirichlet": Dataset("MNIST 10k, Dirichlet(0.1) label skew over 10 clients, MLP",
                               {"dataset": "mnist", "partitioner": "dirichlet", "dirichlet-concentration": 0.1,
                                "model": "mlp", "lr": 0.05, "batch-size": 10, "adapt-batch-size": 10,
                                "local-steps": 10},
                               rounds=30, needs="mnist-10k"),
    "femnist": Dataset("FEMNIST (LEAF sample), its first 10 writers (natural split), cnn-small",
                       {"dataset": "femnist", "partitioner": "natural", "model": "cnn-small", "lr": 0.1,
                        "batch-size": 16, "adapt-batch-size": 16, "local-steps": 20}, rounds=30, needs="femnist-leaf"),
}  # fmt: skip


def run_config(dataset: str, aggregation: str, *, seed: int, rounds: int) -> dict:
    data = DATASETS[dataset]
    return {"strategy": "fedavg", **data.config, "data-dir": str(SHARED_DATA / data.needs), "seed": seed,
            "num-server-rounds": rounds, "eval-every": rounds, "fraction-fit": 1.0, "min-fit-clients": CLIENTS,
            "min-available-clients": CLIENTS, "adapt-steps": 1, "num-threads": 1,
            "validation-fraction": 0.0, **AGGREGATIONS[aggregation]}  # fmt: skip


def arm(run, partitions: list[int], attack: Attack, seed: int) -> None:
    """Make ``partitions`` of ``run`` attackers: their clients answer with ``attack``'s reply."""
    for client in run.clients:
        if client.partition_id not in partitions:
            continue

        def fit(parameters, config, client=client, honest_fit=client.fit):
            labels = client.train_y
            if attack.flips_labels:
                client.train_y = flipped_labels(labels, num_classes=client.data.num_classes)
            try:
                arrays, num_examples, metrics = honest_fit(parameters, config)
            finally:
                client.train_y = labels
            if attack.transform is None:
                return arrays, num_examples, metrics
            sent = unpack(parameters, config.get(LAYOUT))[MODEL]
            sets = unpack(arrays, metrics.get(LAYOUT))
            options = {"rng": np.random.default_rng([seed, client.partition_id, int(config["server-round"])])}
            model = attack.transform(sent, sets.pop(MODEL), **(options if attack.noisy else {}))
            arrays, layout = pack({MODEL: model, **sets})
            return arrays, num_examples, {**metrics, LAYOUT: layout}

        client.fit = fit


def capture_evaluations(run) -> dict[int, dict]:
    """Each partition's last evaluation metrics, filled in as the run evaluates."""
    replies: dict[int, dict] = {}
    for client in run.clients:

        def evaluate(parameters, config, client=client, answer=client.evaluate):
            loss, num_examples, metrics = answer(parameters, config)
            replies[client.partition_id] = dict(metrics)
            return loss, num_examples, metrics

        client.evaluate = evaluate
    return replies


def is_finite_model(arrays: list[np.ndarray]) -> bool:
    return all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in arrays)


def chance_level(settings) -> float:
    """Always answering the most common class of the dataset's test set: the accuracy a useless model keeps."""
    from datasets import load_source

    labels = load_source(settings.data_spec()).test_y
    return float(np.bincount(labels).max() / len(labels))


def one_cell(cell: dict, rounds: int) -> dict:
    """One run; its accuracies, whether it ended non-finite or at chance, and the screen's rejections."""
    from app.local.inprocess import InProcessRun
    from app.server_run import central_evaluator

    started = time.perf_counter()
    config = run_config(cell["dataset"], cell["aggregation"], seed=cell["seed"], rounds=rounds)
    run = InProcessRun(run_config=config, num_clients=CLIENTS)
    partitions = attacker_partitions(cell["seed"], cell["attackers"]) if cell["attack"] != "clean" else []
    if partitions:
        arm(run, partitions, ATTACKS[cell["attack"]], cell["seed"])
    evaluations = capture_evaluations(run)
    rejected, non_finite_from, error = [], None, None
    try:
        for _ in range(rounds):
            run.step()
            rejected.append(int(run.strategy.record.get("clients-rejected", 0)))
            if non_finite_from is None and not is_finite_model(run.strategy.global_model):
                non_finite_from = run.round
        run.evaluate()
        central = central_evaluator(run.settings)(run.strategy.global_model)
    except Exception as err:  # a crash is a finding of the benchmark, not the end of it
        error, central = f"{type(err).__name__}: {err}"[:500], {}
    honest = [m for p, m in sorted(evaluations.items()) if p not in partitions]
    accuracy = central.get("accuracy")
    chance = chance_level(run.settings)
    return {**cell, "rounds": rounds, "attacker-partitions": partitions, "global-accuracy": accuracy,
            "central-loss": central.get("loss"),
            "honest-personalised-accuracy": mean_of(honest, "accuracy"),
            "honest-global-accuracy": mean_of(honest, "global-accuracy"),
            "per-partition": {str(p): {k: m[k] for k in ("accuracy", "global-accuracy") if k in m}
                              for p, m in sorted(evaluations.items())},
            "non-finite": non_finite_from is not None, "non-finite-from-round": non_finite_from,
            "at-chance": accuracy is None or not math.isfinite(accuracy) or accuracy <= chance + CHANCE_MARGIN,
            "chance": chance, "rejected": sum(rejected), "rejected-per-round": rejected, "error": error,
            "wall-seconds": time.perf_counter() - started, "git-commit": git_commit()}  # fmt: skip


def mean_of(metrics: list[dict], key: str) -> float | None:
    values = [float(m[key]) for m in metrics if key in m]
    return statistics.mean(values) if values else None


def git_commit() -> str:
    """The commit the tree was at, ``+dirty`` when tracked files differ from it (others edit this tree too)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return head + ("+dirty" if dirty else "")


# --- the grid, the resumable JSON and the report -------------------------------------------------------------------

KEY_FIELDS = ("dataset", "seed", "aggregation", "attack", "attackers", "rounds")


def cell_key(cell: dict) -> str:
    return "|".join(str(cell[k]) for k in KEY_FIELDS)


def grid(datasets: list[str], seeds: list[int], aggregations: list[str], attacks: list[str],
         counts: list[int]) -> list[dict]:  # fmt: skip
    """Every cell, seed by seed (a stopped run has whole seeds), clean runs first so it has its references."""
    cells = []
    for seed in seeds:
        for dataset in datasets:
            for aggregation in aggregations:
                base = {"dataset": dataset, "seed": seed, "aggregation": aggregation}
                cells.append({**base, "attack": "clean", "attackers": 0})
                cells += [{**base, "attack": a, "attackers": k} for a in attacks for k in counts]
    return cells


def load(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"benchmark": "B10", "cells": []}


def save(path: Path, document: dict) -> None:
    """Write through a temporary file beside it, so a kill mid-write leaves the last complete JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    os.replace(partial, path)


def run_grid(cells: list[dict], rounds: dict[str, int], path: Path, workers: int) -> None:
    document = load(path)
    done = {cell_key(c) for c in document["cells"]}
    todo = [c for c in cells if cell_key({**c, "rounds": rounds[c["dataset"]]}) not in done]
    document.update({"machine": machine(), "sizing": sizing(rounds), "workers": workers})
    document.setdefault("started-at-commit", git_commit())
    document["wall-seconds-before"] = document.get("wall-seconds", 0.0)  # a resumed run adds to the time spent
    print(f"{len(cells) - len(todo)} of {len(cells)} cells already recorded; {len(todo)} to run", flush=True)
    started = time.perf_counter()
    jobs = [(c, rounds[c["dataset"]]) for c in todo]
    if workers > 1:
        from multiprocessing import get_context

        with get_context("spawn").Pool(workers) as pool:
            results = pool.imap_unordered(_one_cell_job, jobs)
            for index, result in enumerate(results, start=1):
                record(document, result, path, index, len(jobs), started)
    else:
        for index, job in enumerate(jobs, start=1):
            record(document, _one_cell_job(job), path, index, len(jobs), started)


def _one_cell_job(job: tuple[dict, int]) -> dict:
    import torch

    torch.set_num_threads(1)
    return one_cell(*job)


def record(document: dict, result: dict, path: Path, index: int, total: int, started: float) -> None:
    document["cells"].append(result)
    document["wall-seconds"] = document.get("wall-seconds-before", 0.0) + time.perf_counter() - started
    save(path, document)
    accuracy = result["global-accuracy"]
    shown = "n/a" if accuracy is None else f"{100 * accuracy:.1f}"
    elapsed = time.perf_counter() - started
    print(f"[{index}/{total} {elapsed / 60:.1f} min] {result['dataset']} s{result['seed']} {result['aggregation']} "
          f"{result['attack']} x{result['attackers']}: {shown} rejected {result['rejected']}"
          f"{' NON-FINITE' if result['non-finite'] else ''}{' ERROR ' + result['error'] if result['error'] else ''} "
          f"({result['wall-seconds']:.1f} s)", flush=True)  # fmt: skip


def sizing(rounds: dict[str, int]) -> dict:
    return {"clients": CLIENTS, "clients-per-round": CLIENTS, "rounds": rounds,
            "local-steps": {d: DATASETS[d].config["local-steps"] for d in rounds},
            "trim-fraction": TRIM_FRACTION, "krum-attackers": KRUM_ATTACKERS, "chance-margin": CHANCE_MARGIN}


def summary(values: list[float]) -> str:
    """``mean ± sd (n)`` in points."""
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f} ({len(values)})"


# the honest clients' means, per client metric: an attacked run's is compared with the same clients in its clean run
PER_CLIENT = {"honest-personalised-accuracy": "accuracy", "honest-global-accuracy": "global-accuracy"}


def reference(clean: dict | None, run: dict, metric: str) -> float | None:
    """The clean run's ``metric`` to compare ``run`` with: for a client mean, over ``run``'s honest clients only."""
    if clean is None or clean.get(metric) is None:
        return None
    if metric not in PER_CLIENT or "per-partition" not in clean:
        return clean[metric]
    attackers = {str(p) for p in run.get("attacker-partitions", [])}
    values = [m[PER_CLIENT[metric]] for p, m in clean["per-partition"].items()
              if p not in attackers and PER_CLIENT[metric] in m]  # fmt: skip
    return statistics.mean(values) if values else None


def table_cell(runs: list[dict], clean: dict[int, dict], metric: str) -> str:
    """The runs' ``metric`` as mean ± sd (seeds), the mean gap to the clean run of the same seed, and flags."""
    values = [r[metric] if r[metric] is not None and math.isfinite(r[metric]) else 0.0 for r in runs]
    text = summary(values)
    references = [reference(clean.get(r["seed"]), r, metric) for r in runs]
    gaps = [v - ref for v, ref in zip(values, references, strict=True) if ref is not None]
    if gaps and runs[0]["attack"] != "clean":
        text += f"; {100 * statistics.mean(gaps):+.1f}"
    flags = [f"{sum(r[flag] for r in runs)} {word}" for flag, word in (("non-finite", "non-finite"),
             ("at-chance", "at chance")) if any(r[flag] for r in runs)]  # fmt: skip
    errors = sum(bool(r["error"]) for r in runs)
    flags += [f"{errors} error"] if errors else []
    rejected = sum(r["rejected"] for r in runs)
    flags += [f"rej {rejected}"] if rejected else []
    return text + (f" **[{', '.join(flags)}]**" if any(r["non-finite"] or r["at-chance"] or r["error"] for r in runs)
                   else f" [{', '.join(flags)}]" if flags else "")  # fmt: skip


def dataset_table(cells: list[dict], dataset: str, metric: str) -> list[str]:
    mine = [c for c in cells if c["dataset"] == dataset]
    aggregations = [a for a in AGGREGATIONS if any(c["aggregation"] == a for c in mine)]
    rows = [("clean", 0)] + sorted({(c["attack"], c["attackers"]) for c in mine if c["attack"] != "clean"},
                                   key=lambda r: (list(ATTACKS).index(r[0]), r[1]))  # fmt: skip
    lines = ["| attack | attackers | " + " | ".join(aggregations) + " |", "|---|---|" + "---|" * len(aggregations)]
    for attack, count in rows:
        row = [ATTACKS[attack].label if attack in ATTACKS else "none (clean)", str(count)]
        for aggregation in aggregations:
            clean = {c["seed"]: c for c in mine if c["aggregation"] == aggregation and c["attack"] == "clean"}
            runs = [c for c in mine if c["aggregation"] == aggregation and c["attack"] == attack
                    and c["attackers"] == count]  # fmt: skip
            row.append(table_cell(sorted(runs, key=lambda r: r["seed"]), clean, metric) if runs else "")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def context(cells: list[dict]) -> list[str]:
    """What a reader needs beside the goal: each rule's clean cost against the mean, and the attacks screened out whole.

    An attack whose every reply the screen rejected leaves the run without those clients: its rows then
    measure the loss of their data, not any poisoning, and are alike across such attacks.
    """
    lines = []
    for dataset in DATASETS:
        mine = [c for c in cells if c["dataset"] == dataset]
        clean = {a: [c["global-accuracy"] or 0.0 for c in mine if c["aggregation"] == a and c["attack"] == "clean"]
                 for a in AGGREGATIONS}  # fmt: skip
        if not clean.get("mean"):
            continue
        costs = [f"{a} {100 * (statistics.mean(v) - statistics.mean(clean['mean'])):+.1f}" for a, v in clean.items()
                 if v and a != "mean"]  # fmt: skip
        lines.append(f"- {dataset}: each rule's clean accuracy against the mean's (points): {', '.join(costs)}; "
                     "a rule's gap to its own clean run says nothing of this cost.")  # fmt: skip
        whole = [a for a in ATTACKS if (runs := [c for c in mine if c["attack"] == a])
                 and all(c["rejected"] == c["rounds"] * c["attackers"] for c in runs)]  # fmt: skip
        if whole:
            lines.append(f"- {dataset}: every reply of {', '.join(whole)} was rejected by the screen, in every round "
                         "of every run: those rows are the run without the attackers' clients (their data "
                         "lost, under label skew perhaps classes few others hold), not a poisoned one.")  # fmt: skip
    return lines


def goal(cells: list[dict]) -> list[str]:
    """Issue 51's goal, checked: robust rules within 2 points of clean with up to 2 attackers; the mean never broken."""
    lines = []
    for dataset in DATASETS:
        mine = [c for c in cells if c["dataset"] == dataset]
        if not mine:
            continue
        misses, robust = [], [a for a in ("median", "trimmed-mean", "krum") if any(c["aggregation"] == a for c in mine)]
        for aggregation in robust:
            clean = {c["seed"]: c["global-accuracy"] for c in mine if c["aggregation"] == aggregation
                     and c["attack"] == "clean"}  # fmt: skip
            for attack in ATTACKS:
                for count in (1, 2):
                    runs = [c for c in mine if c["aggregation"] == aggregation and c["attack"] == attack
                            and c["attackers"] == count and c["seed"] in clean]  # fmt: skip
                    gaps = [(c["global-accuracy"] or 0.0) - clean[c["seed"]] for c in runs]
                    if gaps and statistics.mean(gaps) < -0.02:
                        misses.append(f"{aggregation} / {attack} x{count} ({100 * statistics.mean(gaps):+.1f})")
        broken = [c for c in mine if c["aggregation"] == "mean" and (c["non-finite"] or c["at-chance"] or c["error"])]
        verdict = "yes" if not misses else f"no, {len(misses)} misses: " + "; ".join(misses)
        lines.append(f"- {dataset}: {', '.join(robust) or 'no robust rule measured'} within 2 points of clean (mean "
                     f"gap over seeds) with up to 2 attackers: " + (verdict if robust else "not measured"))
        lines.append(f"- {dataset}: the default mean never non-finite or at chance: "
                     + ("yes" if not broken else "no: " + "; ".join(sorted({f"{c['attack']} x{c['attackers']}"
                                                                          for c in broken}))))  # fmt: skip
    return lines


def report(document: dict) -> str:
    cells = document["cells"]
    sizing_ = document.get("sizing", {})
    commits = sorted({c["git-commit"] for c in cells})
    lines = ["# B10: FedAvg's aggregations against Byzantine clients", "",
             f"Measured on {document.get('machine', '?')}, at commit(s) {', '.join(commits)}; "
             f"{len(cells)} runs, {document.get('wall-seconds', 0) / 60:.0f} min of wall time "
             f"({workers_note(document)}); "
             f"median seconds per run: {per_run_seconds(cells)}.", "",
             f"Sizing: {sizing_.get('clients')} clients, all of them every round, FedAvg, "
             f"{sizing_.get('local-steps')} local steps a round, rounds {sizing_.get('rounds')}; "
             f"trimmed mean drops {sizing_.get('trim-fraction')} of the replies at each end, Krum and multi-Krum "
             f"assume f = {sizing_.get('krum-attackers')} (set for the largest count measured); multi-Krum averages "
             "its n - f best. " + SIZING_NOTE, "",
             "Cells: the global model's accuracy on the dataset's whole test set after the last round, "
             "mean ± sd over seeds (seeds), in %; then the mean gap to the clean run of the same aggregation and "
             "seed, in points. Flags: runs that ended with a non-finite global model, at chance (within "
             f"{100 * CHANCE_MARGIN:.0f} points of always answering the most common test class), or with an error, "
             "in bold (the flags are the runs', judged on the global model, and repeat in the personalised table); "
             "`rej N`: replies the server's screen rejected over all the cell's runs.", "",
             "Attacks (the reply the server receives from each attacker, after honest training): "
             + "; ".join(f"`{k}`: {a.label}" for k, a in ATTACKS.items()) + ". " + ATTACK_NOTE, ""]  # fmt: skip
    for dataset, data in DATASETS.items():
        if not any(c["dataset"] == dataset for c in cells):
            continue
        lines += [f"## {data.label}", "", "Global model, whole test set:", ""]
        lines += dataset_table(cells, dataset, "global-accuracy")
        lines += ["", "Honest clients' mean personalised accuracy (one adaptation step, own test split); the gap is to "
                  "the same clients in the clean run:", ""]
        lines += dataset_table(cells, dataset, "honest-personalised-accuracy")
        lines.append("")
    lines += ["## The goal (issue 51)", "", *goal(cells), "", "## What the table rests on", "", *context(cells), ""]
    return "\n".join(lines)


def workers_note(document: dict) -> str:
    workers = document.get("workers", 1)
    return f"{workers} run{'s' if workers > 1 else ''} side by side, one thread each"


def per_run_seconds(cells: list[dict]) -> str:
    seconds = {d: [c["wall-seconds"] for c in cells if c["dataset"] == d and "wall-seconds" in c] for d in DATASETS}
    return ", ".join(f"{d} {statistics.median(s):.1f}" for d, s in seconds.items() if s) or "n/a"


SIZING_NOTE = ("Sized from one measured cell each: a clean MNIST run (30 rounds of 10 steps) took 2.4 s alone, a "
               "FEMNIST one (30 rounds of 20 steps, where cnn-small reaches 57 % of its ~60 % plateau) 16-18 s; the "
               "570 cells, two side by side, fit about an hour. The attackers are the first k of a permutation of "
               "the 10 partitions drawn from the seed (so 2 attackers include the 1). Every cell is a fresh run from "
               "the seed's initial model; a run whose accuracy is not finite counts as 0 in the means.")  # fmt: skip
ATTACK_NOTE = ("Gaussian noise: sigma is 10 times the RMS of the attacker's own honest update over all its "
               "coordinates, drawn afresh each round from (seed, partition, round). The int64 reply truncates "
               "every array to int64 and sets its first value to 2^62. Label flipping trains on y -> C-1-y and "
               "sends its model as trained.")  # fmt: skip


def main() -> None:
    parser = arguments(__doc__, quick="seed 0, MNIST, clean + each attack by 2 clients, 5 rounds; results under "
                       "bench/results/quick", report_only="re-render the .md from the JSON")  # fmt: skip
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--aggregations", nargs="+", choices=list(AGGREGATIONS), default=list(GRID_AGGREGATIONS))
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--counts", nargs="+", type=int, default=list(ATTACKER_COUNTS))
    parser.add_argument("--rounds", type=int, help="rounds on every dataset (default: each dataset's own)")
    parser.add_argument("--workers", type=int, default=1, help="cells run side by side, one thread each")
    parser.add_argument("--name", default=NAME, help="the results' file stem: a grid measured at another commit "
                        "(another default screen) goes beside the first, not into it")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.datasets, args.seeds, args.counts = args.datasets[:1], [0], [2]
        args.rounds = args.rounds or 5
    folder = results_folder(args.quick)
    path = folder / f"{args.name}.json"
    if not args.report_only:
        missing = [d for d in args.datasets if not (SHARED_DATA / DATASETS[d].needs).exists()]
        if missing:
            raise SystemExit(f"{missing} need data under {SHARED_DATA}: this benchmark cannot run without it")
        rounds = {d: args.rounds or DATASETS[d].rounds for d in args.datasets}
        cells = grid(args.datasets, args.seeds, args.aggregations, args.attacks, args.counts)
        run_grid(cells, rounds, path, args.workers)
    document = load(path)
    (folder / f"{args.name}.md").write_text(report(document))
    print(report(document))


if __name__ == "__main__":
    main()
