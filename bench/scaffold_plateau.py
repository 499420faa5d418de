"""SCAFFOLD where FedAvg leaves FEMNIST's initial plateau: each round's move and control variate, measured.

B9 (``bench/tuned_table.py``) found SCAFFOLD at the label prior (train loss about 3.37 =
0.81 ln 62) after 100 rounds at every lr where FedAvg + update leaves the plateau, also with
every writer in every round, so that no control variate is stale. Both methods take the
same local SGD steps from the same model; SCAFFOLD adds ``c - c_i`` to every step.

This runs both from B7's FEMNIST setting at lr 0.1 with every writer every round, seed 0,
in this process, and records per round: the train loss, the global model's move
``||x_{t+1} - x_t||``, SCAFFOLD's ``||c||`` and mean correction ``||c - c_i||``. With every
client in every round and ``eta_g = 1``, option II gives ``c = mean c_i = (x_t - x_{t+1}) /
(K lr)``, so ``K lr ||c||`` must equal the move: the report's last column checks it.

What it showed (bench/results/scaffold_plateau.md): SCAFFOLD's round-3 move is 9x FedAvg's
and its round-4 move 860x, so the model does not stay on the plateau: it is thrown off it
and lands where the loss is no better than the prior's.

    python -m bench.scaffold_plateau              # 40 rounds of each; about 7 minutes
    python -m bench.scaffold_plateau --quick      # 2 rounds, results under bench/results/quick
    python -m bench.scaffold_plateau --report-only
"""

from __future__ import annotations

import json
import time

from bench.harness import SHARED_DATA, arguments, machine, results_folder, write_report
from bench.personalised_setup import DATASETS, SHARED, tuned_run_config
from strategies.screening.replies import update_norm

DATASET = "femnist"
LR = 0.1  # B7's shared lr on FEMNIST, where FedAvg + update leaves the plateau
LOCAL_STEPS = SHARED["local-steps"]  # B7's K
ROUNDS = 40  # FedAvg leaves the plateau at rounds 30-42 with 10 writers a round
SEED = 0
METHODS = ("fedavg", "scaffold")


def trajectory(method: str, rounds: int) -> dict:
    """One run's per-round train loss, model move and (SCAFFOLD) control-variate norms."""
    from app.local.inprocess import InProcessRun

    keys = {"lr": LR, "fraction-fit": 1.0}
    config = tuned_run_config(DATASET, method, keys, seed=SEED, rounds=rounds, validation=0.0, folder=None)
    run = InProcessRun(run_config=config, num_clients=DATASETS[DATASET].clients)
    started, rows = time.perf_counter(), []
    for _ in range(rounds):
        before = [a.copy() for a in run.strategy.global_shared]
        metrics = run.step()
        rows.append({"round": run.round, "train-loss": metrics.get("train-loss"),
                     "move": update_norm(run.strategy.global_shared, before),
                     "control-norm": metrics.get("scaffold-control-norm"),
                     "correction-norm": metrics.get("scaffold-correction-norm-mean")})  # fmt: skip
        print(f"{method} round {run.round}: loss {rows[-1]['train-loss']:.3f}, move {rows[-1]['move']:.3f}",
              flush=True)  # fmt: skip
    return {"method": method, "keys": keys, "seed": SEED, "rounds": rows, "wall-seconds": time.perf_counter() - started}


def report(runs: list[dict]) -> str:
    by_method = {r["method"]: r["rounds"] for r in runs}
    steps_lr = LOCAL_STEPS * LR
    lines = [f"# SCAFFOLD and FedAvg on FEMNIST's plateau (lr {LR}, every writer every round, seed {SEED})", "",
             "Move: ‖x_{t+1} - x_t‖. With every writer and eta_g = 1, option II gives K lr ‖c‖ = the move "
             f"(K lr = {steps_lr:g}): the last column checks it. ‖c - c_i‖ is the mean over the round's writers.", "",
             "| round | FedAvg loss | FedAvg move | SCAFFOLD loss | SCAFFOLD move | move ratio | ‖c‖ | ‖c - c_i‖ "
             "| K lr ‖c‖ / move |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    fedavg, scaffold = by_method.get("fedavg", []), by_method.get("scaffold", [])
    for a, s in zip(fedavg, scaffold, strict=False):
        identity = ratio(steps_lr * (s["control-norm"] or 0), s["move"])
        lines.append(f"| {a['round']} | {number(a['train-loss'])} | {number(a['move'])} | {number(s['train-loss'])} | "
                     f"{number(s['move'])} | {ratio(s['move'], a['move'])} | {number(s['control-norm'])} | "
                     f"{number(s['correction-norm'])} | {identity} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def ratio(top: float | None, bottom: float | None) -> str:
    return "n/a" if top is None or not bottom else f"{top / bottom:.2f}"


def main() -> None:
    parser = arguments(__doc__, quick="2 rounds of each; results under bench/results/quick",
                       report_only="rebuild the report from the JSON")  # fmt: skip
    args = parser.parse_args()
    if not (SHARED_DATA / "femnist-leaf").exists():
        raise SystemExit(f"FEMNIST is not at {SHARED_DATA / 'femnist-leaf'}: this benchmark needs it")
    rounds = 2 if args.quick else ROUNDS
    folder = results_folder(args.quick)
    folder.mkdir(parents=True, exist_ok=True)
    if args.report_only:  # the JSON keeps the machine the runs were made on
        runs = json.loads((folder / "scaffold_plateau.json").read_text())["runs"]
    else:
        runs = [trajectory(method, rounds) for method in METHODS]
        write_report(folder / "scaffold_plateau.json", {"machine": machine(), "runs": runs}, stamped=False, indent=1)
    (folder / "scaffold_plateau.md").write_text(report(runs))
    print(report(runs))


if __name__ == "__main__":
    main()
