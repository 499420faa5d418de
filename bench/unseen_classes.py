"""Why FedPer, FedRep and pFedMe stay 6-12 points under FedAvg + update on FEMNIST: the classes a writer never wrote.

B9 (``bench/tuned_table.py``) left FedPer and FedRep 11-12 points under tuned FedAvg + update
on FEMNIST's natural split, and about 9 under with every writer in every round; pFedMe 6
under, 1 point better with every writer. Each tests a model trained on the writer's own
data: FedPer's and FedRep's head is the writer's alone, pFedMe's personal model solves a
proximal problem on the writer's data around the global model (Ditto's likewise). In LEAF's
split a writer's test examples are a sample of what that writer wrote, so some are of a
class with no training example of that writer: a model fitted to that writer's data alone
has little reason to predict it, while FedAvg's head learnt every class from the others.

This reruns B9's tested configuration (seed 0, ``--all-clients`` for B9's every-client run)
of each method in this process and splits every client's personalised test predictions
by whether the example's class occurs in that client's training split:

- ``unseen share``: test examples whose class the client never trained on (the data alone);
- per method: accuracy on the seen and on the unseen examples (pooled over clients), and
  the client mean that B9 reports, beside B9's recorded figure for the same run. The two
  agree to the bit when run on the same machine and code (B9's own driver gives the same);
  B9's FEMNIST runs were recorded at an earlier stop, and a rerun of its FedAvg + update
  run with its own driver gives 74.3 where it recorded 74.7.

The predictions are read by wrapping ``clients.evaluation.accuracy_and_loss`` during the
final evaluation: each client's last call on its own test split is the one it reports
(for a client with a personal model, that model's), and the script raises if the captured
predictions do not give the accuracy the clients reported.

    python -m bench.unseen_classes                    # five methods; about 8 minutes alone
    python -m bench.unseen_classes --all-clients      # B9's every-client runs; about 2 hours
    python -m bench.unseen_classes --quick            # 2 rounds of each on FEMNIST, results under bench/results/quick
"""

from __future__ import annotations

import json
import time

import torch

import clients.base
import clients.evaluation
from bench.harness import RESULTS, SHARED_DATA, RunLog, arguments, machine, results_folder, write_report
from bench.personalised_setup import DATASETS, TUNED_KEY_FIELDS, keys_of, tuned_run_config

DATASET = "femnist"
METHODS = ("fedavg", "fedper", "fedrep", "pfedme", "ditto")
SEED = 0
TUNED_LOG = RESULTS / "tuned_table_runs.jsonl"


def tested_job(method: str, all_clients: bool) -> dict:
    """B9's job for ``method``'s tested configuration, seed 0 (its keys come from B9's own ``keys_of``)."""
    rows = [json.loads(line) for line in TUNED_LOG.read_text().splitlines() if line.strip()]
    tested = [r for r in rows if r["dataset"] == DATASET and r["method"] == method and r["phase"] == "test"
              and r["seed"] == SEED]  # fmt: skip
    if not tested:
        raise SystemExit(f"B9 has no tested {method} run on {DATASET}: run bench/tuned_table.py first")
    phase = "all-clients" if all_clients else "test"
    return {"dataset": DATASET, "method": method, "phase": phase, "config": tested[0]["config"], "seed": SEED,
            "rounds": tested[0]["rounds"], "b9-accuracy": b9_accuracy(rows, method, phase, tested[0])}  # fmt: skip


def b9_accuracy(rows: list[dict], method: str, phase: str, tested: dict) -> float | None:
    """B9's recorded accuracy of the same run (``None`` if B9 never ran it)."""
    same = [r for r in rows if r["dataset"] == DATASET and r["method"] == method and r["phase"] == phase
            and r["seed"] == SEED and r["config"] == tested["config"]]  # fmt: skip
    return same[0].get("accuracy") if same else None


class Predictions:
    """Every ``accuracy_and_loss`` call's correct/incorrect vector, by the test split it was called on."""

    def __init__(self) -> None:
        self.last: dict[int, torch.Tensor] = {}  # id(y) -> the last call's per-example correctness
        self.original = clients.evaluation.accuracy_and_loss

    def __enter__(self) -> Predictions:
        def wrapped(model, x, y, chunk: int = 2048):
            result = self.original(model, x, y, chunk)
            model.eval()
            with torch.no_grad():
                predicted = torch.cat([model(x[s : s + chunk]).argmax(dim=1) for s in range(0, len(y), chunk)])
            self.last[id(y)] = (predicted == y).cpu()
            return result

        clients.evaluation.accuracy_and_loss = clients.base.accuracy_and_loss = wrapped
        return self

    def __exit__(self, *exc: object) -> None:
        clients.evaluation.accuracy_and_loss = clients.base.accuracy_and_loss = self.original


def seen_and_unseen(correct: torch.Tensor, test_y: torch.Tensor, train_y: torch.Tensor) -> tuple[int, int, int, int]:
    """``(right, examples)`` on the test examples of classes in ``train_y``, then on the others."""
    known = torch.isin(test_y, torch.unique(train_y))
    return int(correct[known].sum()), int(known.sum()), int(correct[~known].sum()), int((~known).sum())


def split_accuracy(run) -> dict:
    """The final evaluation, with every client's personalised predictions split into seen and unseen classes.

    Raises
    ------
    RuntimeError
        When the captured predictions do not give the accuracy the clients reported.

    """
    with Predictions() as predictions:
        final = run.evaluate()
    counts, client_means = torch.zeros(4, dtype=torch.long), []
    for client in run.clients:
        correct = predictions.last[id(client.test_y)]
        counts += torch.tensor(seen_and_unseen(correct, client.test_y.cpu(), client.train_y.cpu()))
        client_means.append(float(correct.float().mean()))
    captured, reported = sum(client_means) / len(client_means), final["accuracy-client-mean"]
    if abs(captured - reported) > 1e-6:
        raise RuntimeError(f"captured predictions give {captured}, the clients reported {reported}")
    seen_right, seen, unseen_right, unseen = (int(c) for c in counts)
    return {"accuracy": reported, "seen-examples": seen, "unseen-examples": unseen, "seen-accuracy": seen_right / seen,
            "unseen-accuracy": unseen_right / unseen if unseen else None}  # fmt: skip


def one(job: dict, rounds: int) -> dict:
    from app.local.inprocess import InProcessRun

    config = tuned_run_config(DATASET, job["method"], keys_of(job), seed=SEED, rounds=rounds, validation=0.0,
                              folder=None)  # fmt: skip
    started = time.perf_counter()
    run = InProcessRun(run_config=config, num_clients=DATASETS[DATASET].clients)
    for _ in range(rounds):
        run.step()
    return {**job, "rounds": rounds, "keys": keys_of(job), **split_accuracy(run),
            "wall-seconds": time.perf_counter() - started}  # fmt: skip


def pooled(row: dict) -> float:
    """Accuracy over every test example (not the client mean)."""
    right = row["seen-accuracy"] * row["seen-examples"] + (row["unseen-accuracy"] or 0.0) * row["unseen-examples"]
    return right / (row["seen-examples"] + row["unseen-examples"])


def gap_from_unseen(row: dict, reference: dict) -> tuple[float, float]:
    """``(from the unseen examples, in all)``: the pooled accuracy ``row`` loses to ``reference``, in points."""
    share = row["unseen-examples"] / (row["seen-examples"] + row["unseen-examples"])
    unseen = share * ((reference["unseen-accuracy"] or 0.0) - (row["unseen-accuracy"] or 0.0))
    return 100 * unseen, 100 * (pooled(reference) - pooled(row))


def report(rows: list[dict]) -> str:
    first = rows[0]
    share = first["unseen-examples"] / (first["unseen-examples"] + first["seen-examples"])
    reference = next((r for r in rows if r["method"] == "fedavg"), None)
    lines = [f"# Seen and unseen classes on FEMNIST ({rows[0]['phase']} setting, seed {SEED})", "",
             f"{first['unseen-examples']} of {first['unseen-examples'] + first['seen-examples']} test examples "
             f"({100 * share:.1f} %) are of a class with no training example of the same writer. Pooled: over every "
             "test example; the last column is the part of the pooled gap to FedAvg + update that falls on the "
             "unseen classes.", "",
             "| method | accuracy (client mean) | B9's recorded figure | seen classes | unseen classes | pooled "
             "| pooled gap from the unseen classes |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        b9 = "n/a" if row["b9-accuracy"] is None else f"{100 * row['b9-accuracy']:.1f}"
        unseen = "n/a" if row["unseen-accuracy"] is None else f"{100 * row['unseen-accuracy']:.1f}"
        gap = ""
        if reference is not None and row is not reference:
            gap = "{:.1f} of {:.1f} points".format(*gap_from_unseen(row, reference))
        lines.append(f"| {row['method']} | {100 * row['accuracy']:.1f} | {b9} | {100 * row['seen-accuracy']:.1f} | "
                     f"{unseen} | {100 * pooled(row):.1f} | {gap} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = arguments(__doc__, quick="2 rounds of each; results under bench/results/quick", report_only=True)
    parser.add_argument("--all-clients", action="store_true", help="every writer every round (B9's all-clients run)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    if not (SHARED_DATA / "femnist-leaf").exists():
        raise SystemExit(f"FEMNIST is not at {SHARED_DATA / 'femnist-leaf'}: this benchmark needs it")
    folder = results_folder(args.quick)
    folder.mkdir(parents=True, exist_ok=True)
    name = "unseen_classes" + ("_all_clients" if args.all_clients else "")
    log = RunLog(path=folder / f"{name}_runs.jsonl", key_fields=TUNED_KEY_FIELDS)
    rows = []
    for method in args.methods:
        job = tested_job(method, args.all_clients)
        rounds = 2 if args.quick else job["rounds"]
        row = log.get({**job, "rounds": rounds})
        if row is None and not args.report_only:
            row = one(job, rounds)
            log.append(row)
            print(f"{method}: {100 * row['accuracy']:.1f} (seen {100 * row['seen-accuracy']:.1f}, unseen "
                  f"{100 * (row['unseen-accuracy'] or 0):.1f}) in {row['wall-seconds']:.0f} s", flush=True)  # fmt: skip
        if row is not None:
            rows.append(row)
    if rows:
        write_report(folder / f"{name}.json", {"machine": machine(), "runs": rows}, report(rows), stamped=False,
                     indent=1)  # fmt: skip
        print(report(rows))


if __name__ == "__main__":
    main()
