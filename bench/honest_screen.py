"""How many honest fit replies the update-norm screen would reject, per ratio: the measurement behind its default.

``max-update-ratio`` (strategies/rounds/global_model.py ``screen_update_norms``) drops a fit reply
when, among a round's replies (at least 3), one of three quantities exceeds the ratio
times that round's median of the same quantity:

- the model update: ``||reply - sent||`` over the floating-point arrays of the model
  that travels, in float64, against the arrays *that* client was sent;
- the integer arrays' change (BatchNorm's step counters), measured the same way;
- the norm of every returned array set of kind ``update`` or ``values`` (SCAFFOLD's
  ``delta-control``, FedProto's ``prototypes``).

This script runs honest federations in this process (``app/local/inprocess.py``, real
stamen strategies and clients, Flower's encoding) with ``max-update-ratio = 0``, so the
run itself rejects nothing, and wraps every proxy's ``fit`` to measure each reply's three
quantities itself, from the instruction and the reply as they travel (unpacked by their
``payload`` layouts), without the server's code. After each round it asks, for each
ratio r in ``RATIOS``, which replies exceed r x the round's median: honest replies a
default of r would have thrown away. The server's own record (``update-norm-median``)
is compared with ours each round, as a check that both measure the same thing.

It also asks what each r catches. For every honest reply it puts in its place the reply
of one of B10's attacks (bench/robust.py) and tests it against the round's new median:
scaling x100 and the x5 sign flip multiply the update's norm by 100 and 5, and B10's
Gaussian noise (sigma 10x the update's RMS, replacing the update) gives a norm of about
10x the honest one. The caught fraction is over all honest replies of a scenario.

Scenarios (seed 0 each):

- ``b1-quick``: B1 ``--quick``'s rows (bench/perfedavg_table1.py ``QUICK_ROWS``, its
  ``run_config``: MNIST 10k, the Per-FedAvg paper's split, 50 users, MLP, fraction 0.2,
  beta 0.1), FedAvg and Per-FedAvg FO / HF / SO, ``B1_ROUNDS`` rounds;
- ``femnist``: B7's FEMNIST (bench/personalised_table.py: natural split, 105 writers,
  cnn-small, lr 0.1, batch 16, about 10 writers a round), every registered method,
  ``FEMNIST_ROUNDS`` rounds;
- ``cifar-practical``: B8's practical split (bench/cifar_table.py: CIFAR-10 JPEGs,
  pfllib-practical Dirichlet(0.1), 20 clients every round, fedavg-cnn, its shared keys),
  ``CIFAR_METHODS``, ``CIFAR_ROUNDS`` rounds.

    python -m bench.honest_screen --quick                 # a few rounds of a few methods; bench/results/quick
    python -m bench.honest_screen                         # the three scenarios (resumable)
    python -m bench.honest_screen --scenarios femnist     # one scenario (another process may run the others)
    python -m bench.honest_screen --report-only           # the .md from the JSON

Writes ``bench/results/honest_screen.json`` after every run (several processes may share
it: each merges its run in under a lock) and ``honest_screen.md``; a run already in the
JSON is not run again.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.harness import REPO, SHARED_DATA, arguments, stamp
from strategies.contracts.payload import LAYOUT, MODEL, unpack

NAME = "honest_screen"
RATIOS = (2, 3, 5, 10, 20, 50)
MINIMUM_REPLIES = 3  # the screen compares a round's replies only when there are at least this many
MARGIN = 2.0  # the default must sit at least this far above the largest honest ratio seen (one run, one seed each)
B1_ROUNDS = 100  # B1 --quick's own (perfedavg_table1.py --rounds)
FEMNIST_ROUNDS = 15
CIFAR_ROUNDS = 10
CIFAR_METHODS = ("fedavg", "perfedavg", "ditto", "fedrep", "fedproto", "scaffold")
# FedBN keeps its BatchNorm layers at home, so it needs a model with them (B8's choice); cnn-small has none
BN_MODEL = "fedavg-cnn-bn"
# B10's attacks that act on the update's scale (bench/robust.py): what each multiplies the honest norm by
ATTACKS = {"scaling x100": 100.0, "sign flip x5": 5.0, "Gaussian noise 10x RMS": 10.0}
UPDATE, COUNTERS = "update", "integer arrays"  # the two model quantities; a returned set is "set <name>"


# --- measuring a reply, independently of the server's screen --------------------------------------------------------


def change_norm(reply: Sequence[np.ndarray], sent: Sequence[np.ndarray], *, integers: bool) -> float:
    """``||reply - sent||`` in float64 over the floating arrays (``integers=False``) or the integer ones."""
    total = 0.0
    for now, before in zip(reply, sent, strict=True):
        kind = np.asarray(now).dtype
        if np.issubdtype(kind, np.integer) if integers else np.issubdtype(kind, np.floating):
            step = np.asarray(now, dtype=np.float64).ravel() - np.asarray(before, dtype=np.float64).ravel()
            total += float(step @ step)
    return math.sqrt(total)


def plain_norm(arrays: Sequence[np.ndarray]) -> float:
    """``||arrays||`` in float64."""
    return math.sqrt(sum(float(a @ a) for a in (np.asarray(x, dtype=np.float64).ravel() for x in arrays)))


def reply_norms(sent: dict[str, list[np.ndarray]], back: dict[str, list[np.ndarray]],
                screened_sets: Sequence[str]) -> dict[str, float]:  # fmt: skip
    """The screen's quantities for one reply: model update, integer change (where any), each screened set's norm."""
    norms = {}
    model, before = back.get(MODEL, []), sent.get(MODEL, [])
    if model:  # a method whose model never travels (FedProto) has no update to measure
        norms[UPDATE] = change_norm(model, before, integers=False)
        if any(np.issubdtype(np.asarray(a).dtype, np.integer) for a in model):
            norms[COUNTERS] = change_norm(model, before, integers=True)
    for name in screened_sets:
        norms[f"set {name}"] = plain_norm(back[name])
    return norms


def watch(run, replies: list[dict]) -> None:
    """Wrap every client's ``fit`` so that each reply's norms are appended to ``replies`` as it is sent."""
    screened = [s.name for s in run.strategy.contract.returns if s.kind in ("update", "values")]
    for client in run.clients:

        def fit(parameters, config, honest_fit=client.fit, partition=client.partition_id):
            arrays, num_examples, metrics = honest_fit(parameters, config)
            sent = unpack(parameters, config.get(LAYOUT))
            back = unpack(arrays, metrics.get(LAYOUT))
            replies.append({"partition": partition, "norms": reply_norms(sent, back, screened)})
            return arrays, num_examples, metrics

        client.fit = fit


# --- one round's verdicts -------------------------------------------------------------------------------------------


def ratios_of(norms: list[float]) -> tuple[float, list[float]] | None:
    """The round's median and each norm over it, or ``None`` where the screen has no scale (too few, median 0)."""
    if len(norms) < MINIMUM_REPLIES:
        return None
    median = float(np.median(norms))
    if not math.isfinite(median) or median == 0.0:
        return None
    return median, [norm / median for norm in norms]


def caught_fraction(norms: list[float], factor: float, ratio: float) -> tuple[int, int]:
    """Of ``norms``' replies, each in turn multiplied by ``factor`` (one attacker): how many exceed ``ratio`` x median.

    Returns the count caught and the count tried (rounds where the screen has a scale).
    """
    caught = tried = 0
    for i, norm in enumerate(norms):
        attacked = [*norms[:i], factor * norm, *norms[i + 1 :]]
        measured = ratios_of(attacked)
        if measured is None:
            continue
        tried += 1
        caught += measured[1][i] > ratio
    return caught, tried


def judge_round(replies: list[dict]) -> dict:
    """Per quantity the median and ratios; per r the honest replies any quantity would reject; the attacks' catch."""
    quantities = sorted({q for reply in replies for q in reply["norms"]})
    verdict = {"replies": len(replies), "median": {}, "max-ratio": {}, "argmax": {}, "ratios": {}, "non-finite": 0}
    flagged = {r: set() for r in RATIOS}
    verdict["non-finite"] = sum(not all(map(math.isfinite, reply["norms"].values())) for reply in replies)
    for q in quantities:
        norms = [reply["norms"][q] for reply in replies]
        measured = ratios_of(norms)
        if measured is None:
            continue
        median, ratios = measured
        top = int(np.argmax(ratios))
        verdict["median"][q], verdict["max-ratio"][q] = median, ratios[top]
        verdict["argmax"][q] = replies[top]["partition"]
        verdict["ratios"][q] = ratios
        for r in RATIOS:
            flagged[r] |= {i for i, ratio in enumerate(ratios) if ratio > r}
    verdict["rejected"] = {str(r): len(flagged[r]) for r in RATIOS}
    if UPDATE in verdict["median"]:
        norms = [reply["norms"][UPDATE] for reply in replies]
        verdict["attacks"] = {attack: {str(r): caught_fraction(norms, factor, r) for r in RATIOS}
                              for attack, factor in ATTACKS.items()}  # fmt: skip
    return verdict


# --- the scenarios --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One run: its scenario, its label there, the run config and the clients."""

    scenario: str
    label: str
    config: dict
    clients: int
    rounds: int


def b1_jobs(rounds: int, quick: bool) -> list[Job]:
    from bench.perfedavg_setup import DEFAULT_DATA, METHODS, NUM_USERS, QUICK_ROWS, run_config

    jobs = []
    for r, row in enumerate(QUICK_ROWS[:1] if quick else QUICK_ROWS):
        for label, strategy, variant in METHODS[:2] if quick else METHODS:
            config = run_config(row, strategy, variant, beta=0.1, rounds=rounds, seed=0, data_dir=DEFAULT_DATA,
                                results=tempfile.gettempdir(), name=f"honest-screen-b1-{r}")  # fmt: skip
            jobs.append(Job("b1-quick", f"{label} ({row.label})", config, NUM_USERS, rounds))
    return jobs


def femnist_jobs(rounds: int, quick: bool) -> list[Job]:
    from app.registry import METHODS
    from bench.personalised_setup import DATASETS, personalised_run_config

    dataset = DATASETS["femnist"]
    methods = ("fedavg", "scaffold", "fedproto") if quick else tuple(METHODS)

    def config(method: str, model: str | None) -> dict:
        keys = personalised_run_config(method, dataset, seed=0, rounds=rounds, results=tempfile.gettempdir(),
                                       name="honest-screen", folder=None)  # fmt: skip
        return {**keys, "model": model} if model else keys

    jobs = [Job("femnist", method, config(method, BN_MODEL if method == "fedbn" else None), dataset.clients, rounds)
            for method in methods]  # fmt: skip
    if not quick:  # BatchNorm's step counters travel only with a model that has them and a method that sends them
        jobs.append(Job("femnist", f"fedavg ({BN_MODEL})", config("fedavg", BN_MODEL), dataset.clients, rounds))
    return jobs


def cifar_jobs(rounds: int, quick: bool) -> list[Job]:
    from bench.cifar_setup import CLIENTS, run_config

    methods = ("fedavg",) if quick else CIFAR_METHODS
    return [Job("cifar-practical", method, run_config("practical", method, seed=0, rounds=rounds, threads=1), CLIENTS,
                rounds) for method in methods]  # fmt: skip


@dataclass(frozen=True)
class Scenario:
    label: str
    jobs: Callable[[int, bool], list[Job]]
    rounds: int
    quick_rounds: int
    needs: str


SCENARIOS = {
    "b1-quick": Scenario("B1 --quick's setting: MNIST 10k, Per-FedAvg paper split, 50 users, MLP, 10 a round",
                         b1_jobs, B1_ROUNDS, 3, "mnist-10k"),
    "femnist": Scenario("B7's FEMNIST: natural split, 105 writers, cnn-small, about 10 a round", femnist_jobs,
                        FEMNIST_ROUNDS, 3, "femnist-leaf"),
    "cifar-practical": Scenario("B8's practical split: CIFAR-10, pfllib-practical, 20 clients every round, "
                                "fedavg-cnn", cifar_jobs, CIFAR_ROUNDS, 2, "cifar10-jpeg"),
}  # fmt: skip


def one_run(job: Job) -> dict:
    """A run of ``job``'s config with the screen off; each round judged at every ratio."""
    from app.local.inprocess import InProcessRun

    started = time.perf_counter()
    config = {**job.config, "max-update-ratio": 0.0, "num-threads": 1}  # the run rejects nothing; we judge
    replies: list[dict] = []
    rounds, error = [], None
    try:
        run = InProcessRun(run_config=config, num_clients=job.clients)
        watch(run, replies)
        for _ in range(job.rounds):
            replies.clear()
            run.step()
            verdict = judge_round(replies)
            record = run.strategy.record
            verdict["round"] = run.round
            verdict["server-rejected"] = int(record.get("clients-rejected", 0)) + int(record.get("clients-outsized", 0))
            if UPDATE in verdict["median"] and "update-norm-median" in record:
                ours, theirs = verdict["median"][UPDATE], float(record["update-norm-median"])
                verdict["server-median-gap"] = abs(ours - theirs) / max(abs(theirs), 1e-300)
            rounds.append(verdict)
    except Exception as err:  # a run that fails is a finding, not the end of the measurement
        error = f"{type(err).__name__}: {err}"[:500]
    return summarise(job, rounds, error, time.perf_counter() - started)


def summarise(job: Job, rounds: list[dict], error: str | None, seconds: float) -> dict:
    """One run's totals: honest rejections per r, the largest ratio per quantity and where, the attacks' catch."""
    quantities = sorted({q for v in rounds for q in v["max-ratio"]})
    largest = {}
    for q in quantities:
        top = max((v for v in rounds if q in v["max-ratio"]), key=lambda v: v["max-ratio"][q])
        every = [x for v in rounds for x in v["ratios"].get(q, [])]
        largest[q] = {"max-ratio": top["max-ratio"][q], "round": top["round"], "partition": top["argmax"][q],
                      "p90-ratio": float(np.percentile(every, 90)), "min-ratio": min(every),
                      "median-of-round-medians": statistics.median(v["median"][q] for v in rounds
                                                                   if q in v["median"])}  # fmt: skip
    attacks = {}
    for attack in ATTACKS:
        for r in RATIOS:
            pairs = [v["attacks"][attack][str(r)] for v in rounds if "attacks" in v]
            if pairs:
                attacks.setdefault(attack, {})[str(r)] = [sum(c for c, _ in pairs), sum(t for _, t in pairs)]
    gaps = [v["server-median-gap"] for v in rounds if "server-median-gap" in v]
    per_round = compact([{"round": v["round"], "replies": v["replies"], "median": v["median"],
                          "max-ratio": v["max-ratio"], "rejected": v["rejected"]} for v in rounds])  # fmt: skip
    return {"scenario": job.scenario, "label": job.label, "strategy": job.config["strategy"], "rounds": job.rounds,
            "rounds-run": len(rounds), "replies": sum(v["replies"] for v in rounds),
            "rounds-screened": sum(bool(v["median"]) for v in rounds),
            "rejected": {str(r): sum(v["rejected"][str(r)] for v in rounds) for r in RATIOS},
            "largest": largest, "attacks": attacks, "non-finite": sum(v["non-finite"] for v in rounds),
            "server-rejected": sum(v["server-rejected"] for v in rounds),
            "server-median-gap": max(gaps) if gaps else None, "error": error, "seconds": seconds,
            "config": portable(job.config), "git-commit": git_commit(), "per-round": per_round}  # fmt: skip


def compact(per_round: list[dict]) -> list[dict]:
    """Rounds' figures to 4 significant digits and their rejections only where there are any: the JSON stays small."""
    return [{**v, "median": {q: float(f"{m:.4g}") for q, m in v["median"].items()},
             "max-ratio": {q: float(f"{m:.4g}") for q, m in v["max-ratio"].items()},
             "rejected": {r: n for r, n in v["rejected"].items() if n}} for v in per_round]  # fmt: skip


def portable(config: dict) -> dict:
    """``config`` with paths beside the checkout written as ``../`` (the data's place relative to the project)."""
    outside = f"{REPO.parent}/"
    return {k: v.replace(outside, "../") if isinstance(v, str) else v for k, v in config.items()}


def git_commit() -> str:
    """The commit the tree was at, ``+dirty`` when tracked files differ from it (others edit this tree too)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return head + ("+dirty" if dirty else "")


# --- the resumable JSON and the report ------------------------------------------------------------------------------


def run_key(run: dict) -> str:
    return f"{run['scenario']}|{run['label']}|{run['rounds']}"


def merge(path: Path, run: dict | None) -> dict:
    """Add ``run`` to the JSON at ``path`` under a lock (other processes may be adding theirs); the document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the lock lives beside the scratch files, not in bench/results, where it would be one more file to ignore
    with open(Path(tempfile.gettempdir()) / f"{NAME}-{zlib.crc32(str(path.resolve()).encode())}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        document = json.loads(path.read_text()) if path.exists() else {"benchmark": "honest-screen", "runs": []}
        if run is not None:
            document["runs"] = [r for r in document["runs"] if run_key(r) != run_key(run)] + [run]
            document.update(ratios=list(RATIOS), margin=MARGIN, **stamp(),
                            scenarios={k: s.label for k, s in SCENARIOS.items()})  # fmt: skip
            document["summary"] = overall(document["runs"])
            partial = path.with_suffix(".json.partial")  # a kill mid-write leaves the last complete JSON
            partial.write_text(json.dumps(document, indent=1) + "\n")
            os.replace(partial, path)
    return document


def overall(runs: list[dict]) -> dict:
    """Per scenario and in all: honest rejections per r, the largest honest ratio per quantity, the recommended r."""
    scenarios: dict[str, dict] = {}
    for run in runs:
        s = scenarios.setdefault(run["scenario"], {"rejected": {str(r): 0 for r in RATIOS}, "max-ratio": {},
                                                   "attacks": {}, "replies": 0})  # fmt: skip
        s["replies"] += run["replies"]
        for r in RATIOS:
            s["rejected"][str(r)] += run["rejected"][str(r)]
        for q, largest in run["largest"].items():
            s["max-ratio"][q] = max(s["max-ratio"].get(q, 0.0), largest["max-ratio"])
        for attack, per_r in run["attacks"].items():
            into = s["attacks"].setdefault(attack, {str(r): [0, 0] for r in RATIOS})
            for r, (caught, tried) in per_r.items():
                into[r] = [into[r][0] + caught, into[r][1] + tried]
    honest_max = max((m for s in scenarios.values() for m in s["max-ratio"].values()), default=0.0)
    clean = [r for r in RATIOS if all(s["rejected"][str(r)] == 0 for s in scenarios.values())]
    with_margin = [r for r in clean if r >= MARGIN * honest_max]
    return {"scenarios": scenarios, "largest-honest-ratio": honest_max, "zero-rejection-ratios": clean,
            "recommended": with_margin[0] if with_margin else None}  # fmt: skip


def markdown(document: dict) -> str:
    runs, summary = document["runs"], document["summary"]
    lines = ["# Honest replies the update-norm screen would reject, per max-update-ratio r", "",
             "Honest federations run with the screen off (`max-update-ratio = 0`); every fit reply's quantities are "
             "measured from the instruction and the reply as they travel (model update over the float arrays, the "
             "integer arrays' change, the norm of each returned set of kind update/values), each against its "
             f"round's median (rounds with at least {MINIMUM_REPLIES} replies). A cell counts the honest replies "
             "whose norm exceeds r x that median in any quantity; the last columns give the largest ratio (norm / "
             "round median) seen per quantity. Seed 0, one run per row.", ""]  # fmt: skip
    for key, label in document["scenarios"].items():
        mine = [run for run in runs if run["scenario"] == key]
        if not mine:
            continue
        rounds = sorted({run["rounds"] for run in mine})
        jobs = SCENARIOS[key].jobs(rounds[0], False) if key in SCENARIOS else []
        order = {job.label: i for i, job in enumerate(jobs)}
        mine.sort(key=lambda run: order.get(run["label"], len(order)))  # the scenario's order, whoever ran first
        quantities = sorted({q for run in mine for q in run["largest"]}, key=lambda q: (q != UPDATE, q != COUNTERS, q))
        lines += [f"## {key}: {label}, {'/'.join(map(str, rounds))} rounds", "",
                  "| method | replies | rounds screened | " + " | ".join(f"r = {r}" for r in RATIOS) + " | "
                  + " | ".join(f"max ratio: {q}" for q in quantities) + " |",
                  "|---|" + "---|" * (2 + len(RATIOS) + len(quantities))]  # fmt: skip
        for run in mine:
            cells = [str(run["rejected"][str(r)]) for r in RATIOS]
            largest = [f"{run['largest'][q]['max-ratio']:.2f}" if q in run["largest"] else "" for q in quantities]
            note = f" (stopped: {run['error']})" if run["error"] else ""
            note += f" ({run['non-finite']} non-finite)" if run["non-finite"] else ""
            lines.append(f"| {run['label']}{note} | {run['replies']} | {run['rounds-screened']} | "
                         + " | ".join(cells) + " | " + " | ".join(largest) + " |")  # fmt: skip
        s = summary["scenarios"][key]
        worst = ", ".join(f"{q} {m:.2f}" for q, m in sorted(s["max-ratio"].items()))
        top_q, top = max(((q, (run, v)) for run in mine for q, v in run["largest"].items()),
                         key=lambda item: item[1][1]["max-ratio"])  # fmt: skip
        lines += ["", f"All {s['replies']} replies: rejected at r = "
                  + ", ".join(f"{r}: {s['rejected'][str(r)]}" for r in RATIOS) + f"; largest honest ratio: {worst} "
                  f"(the largest: {top[0]['label']}, round {top[1]['round']}, partition {top[1]['partition']}, "
                  f"{top_q}).", ""]  # fmt: skip
    lines += ["## What each r catches", "",
              "Each honest reply of a scenario replaced in turn by one of B10's attacks (bench/robust.py) on its "
              "model update, against the round's median with the attacked reply in it (one attacker a round): the "
              "share caught.", "",
              "| scenario | attack | " + " | ".join(f"r = {r}" for r in RATIOS) + " |",
              "|---|---|" + "---|" * len(RATIOS)]  # fmt: skip
    for key, s in summary["scenarios"].items():
        for attack, per_r in s["attacks"].items():
            cells = [f"{100 * c / t:.0f}%" if t else "n/a" for c, t in (per_r[str(r)] for r in RATIOS)]
            lines.append(f"| {key} | {attack} | " + " | ".join(cells) + " |")
    lines += ["", "The largest r that catches at least 95% of an attack's replies in every scenario, and the honest "
              "replies that r rejects over all scenarios:", ""]  # fmt: skip
    everywhere = {r: sum(s["rejected"][str(r)] for s in summary["scenarios"].values()) for r in RATIOS}
    for attack in ATTACKS:
        shares = [[c / t if t else 1.0 for c, t in (s["attacks"][attack][str(r)] for r in RATIOS)]
                  for s in summary["scenarios"].values() if attack in s["attacks"]]  # fmt: skip
        catching = [r for i, r in enumerate(RATIOS) if shares and all(share[i] >= 0.95 for share in shares)]
        lines.append(f"- {attack}: " + (f"r = {catching[-1]}, which rejects {everywhere[catching[-1]]} honest replies"
                                         if catching else "no r in the list") + ".")  # fmt: skip
    recommended = summary["recommended"]
    lines += ["", "Honest replies rejected over all scenarios: " + ", ".join(f"r = {r}: {n}" for r, n in
                                                                             everywhere.items()) + ".",
              "", f"Largest honest ratio over every scenario and quantity: {summary['largest-honest-ratio']:.2f}. "
              f"Ratios with no honest rejection anywhere: {summary['zero-rejection-ratios']}; the smallest with the "
              f"largest honest ratio at most 1/{MARGIN:g} of it: "
              + (f"**r = {recommended}**." if recommended else "none in the list.")]  # fmt: skip
    gaps = [run["server-median-gap"] for run in runs if run["server-median-gap"] is not None]
    rejected = sum(run["server-rejected"] for run in runs)
    lines += ["", f"Check: the server's own recorded update-norm median differs from ours by at most "
              f"{max(gaps, default=0.0):.1e} (relative); the runs' own screens rejected {rejected} replies. "
              f"Machine: {document['machine']}; {sum(r['seconds'] for r in runs) / 60:.0f} minutes of runs; commits "
              f"{', '.join(sorted({r['git-commit'] for r in runs}))}"
              + (" (+dirty: tracked files other than this script differed from the commit, as they do in a tree "
                 "several people edit)" if any(r["git-commit"].endswith("+dirty") for r in runs) else "")
              + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = arguments(__doc__, out=f"{NAME}.json", quick="a few rounds of a few methods; bench/results/quick",
                       report_only="the .md from the JSON, no new runs")  # fmt: skip
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--methods", nargs="+", help="only the runs whose label starts with one of these")
    parser.add_argument("--rounds", type=int, help="every scenario's rounds (default: each scenario's own)")
    args = parser.parse_args()
    started = time.perf_counter()
    for key in [] if args.report_only else args.scenarios:
        scenario = SCENARIOS[key]
        if not (SHARED_DATA / scenario.needs).exists():
            print(f"{key}: needs {SHARED_DATA / scenario.needs}; skipped", flush=True)
            continue
        rounds = args.rounds or (scenario.quick_rounds if args.quick else scenario.rounds)
        for job in scenario.jobs(rounds, args.quick):
            if args.methods and not job.label.startswith(tuple(args.methods)):
                continue
            done = merge(args.out, None)
            if any(run_key(r) == f"{job.scenario}|{job.label}|{job.rounds}" for r in done["runs"]):
                continue
            run = one_run(job)
            merge(args.out, run)
            largest = ", ".join(f"{q} {v['max-ratio']:.2f}" for q, v in run["largest"].items())
            print(f"[{time.perf_counter() - started:6.0f} s] {key} {job.label}: {run['replies']} replies, rejected "
                  f"{run['rejected']}, largest ratio {largest}" + (f", error {run['error']}" if run["error"] else ""),
                  flush=True)  # fmt: skip
    document = merge(args.out, None)
    if document["runs"]:
        args.out.with_suffix(".md").write_text(markdown(document))
        print(markdown(document))


if __name__ == "__main__":
    main()
