"""What one round says about the step size, at the start and on FEMNIST's plateau (B2's start probe, why).

On ``../shared/data/femnist-leaf`` with B2's model (``cnn-small``), batch 16 and one local
epoch, from three models:

- the seeded initial model;
- the model after 30 rounds of FedAvg at lr 0.01 (10 writers a round): the plateau B2's
  run from lr 0.01 sits on;
- the model after 30 rounds at lr 0.6 (twice B2's start from above).

From each, writers 0-29 each train one epoch at every lr in ``LRS``, and for each lr it
reports the global loss (on the training images of writers 60-104) after the mean of
their updates, the mean local progress ``rho = mean local loss / first step's loss``
(what the start probe compares) and the spread of ``rho`` over cohorts of 3 writers.

Then the start probe itself, as B2 runs it (in process, ``app/local/inprocess.py``): its 3 rounds
from lr 0.01, 0.1 and 0.3 for seeds 0-2, every reply's ``rho`` by slot, and the slot that
the mean (the probe's rule) and the median of ``rho`` would choose.

    python -m bench.step_signals     # about 8 minutes on 2 cores; bench/results/step_signals.json and .md
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from app.local.inprocess import InProcessRun
from bench.fathom_setup import PROBE, Start, run_config
from bench.harness import RESULTS, SHARED_DATA, machine, write_report
from clients.batches import to_tensor
from clients.losses import axpy, gradient, model_loss
from clients.models import build_model
from datasets.leaf import load_femnist
from strategies.contracts.client_reports import START_LOSS, TRAIN_LOSS
from strategies.tuning.start_probe import local_progress

LRS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
BATCH, PROBED, HELD_OUT, WARM_ROUNDS, PER_ROUND = 16, range(30), range(60, 105), 30, 10
STARTS = {"initial model": None, "after 30 rounds at lr 0.01": 0.01, "after 30 rounds at lr 0.6": 0.6}


def main() -> None:
    data = SHARED_DATA / "femnist-leaf"
    if not (data / "train").is_dir():
        sys.exit(f"needs {data} (LEAF FEMNIST)")
    started = time.perf_counter()
    source = load_femnist(data)
    x, y = to_tensor(source.train_x, torch.device("cpu")), torch.as_tensor(source.train_y)
    groups = source.train_groups
    model = build_model("cnn-small", input_shape=(1, 28, 28), num_classes=62, seed=0)
    loss_fn = model_loss(model)
    held = torch.as_tensor(np.concatenate([groups[w] for w in HELD_OUT]))

    def global_loss(params: tuple) -> float:
        with torch.no_grad():
            return float(loss_fn(params, (x[held], y[held])))

    def epoch(params: tuple, writer: int, lr: float, rng: np.random.Generator) -> tuple[tuple, list[float]]:
        order, losses = rng.permutation(groups[writer]), []
        for begin in range(0, len(order), BATCH):
            idx = torch.as_tensor(order[begin : begin + BATCH])
            grads, loss = gradient(loss_fn, params, (x[idx], y[idx]))
            losses.append(float(loss))
            params = axpy(params, grads, -lr)
        return params, losses

    def mean_update(params: tuple, writers, lr: float, rng: np.random.Generator) -> tuple[tuple, list[float]]:
        deltas, rhos = [], []
        for writer in writers:
            trained, losses = epoch(params, writer, lr, rng)
            deltas.append([t - p for t, p in zip(trained, params, strict=True)])
            rhos.append(float(np.mean(losses) / losses[0]))
        mean = tuple(torch.stack([d[k] for d in deltas]).mean(0) for k in range(len(params)))
        return axpy(params, mean, 1.0), rhos

    initial = tuple(p.detach() for p in model.parameters())
    rows = []
    for label, warm_lr in STARTS.items():
        params, rng = initial, np.random.default_rng(1)
        for _ in range(WARM_ROUNDS if warm_lr else 0):
            params, _ = mean_update(params, rng.choice(len(groups), PER_ROUND, replace=False), warm_lr, rng)
        before = global_loss(params)
        for lr in LRS:
            after, rhos = mean_update(params, PROBED, lr, np.random.default_rng(0))
            cohorts = [float(np.mean(rhos[i : i + 3])) for i in range(0, len(rhos), 3)]
            rows.append({"start": label, "lr": lr, "global-loss-before": before,
                         "global-loss-after": global_loss(after), "rho-mean": float(np.mean(rhos)),
                         "rho-cohort-sd": float(np.std(cohorts))})  # fmt: skip
        print(f"{label}: done", flush=True)
    probes = [probe_slots(lr, seed, data) for lr in (0.01, 0.1, 0.3) for seed in (0, 1, 2)]
    results = {"benchmark": "step_signals", "machine": machine(), "seconds": time.perf_counter() - started,
               "batch": BATCH, "probed-writers": len(PROBED), "held-out-writers": len(HELD_OUT), "rows": rows,
               "probes": probes}
    lines = ["One epoch (batch 16) on writers 0-29 from each model, at each lr: the global loss on writers 60-104's "
             "training images after their mean update, and rho = mean local loss / first step's loss.", "",
             "| from | global loss before | lr | global loss after | mean rho | sd of rho over 3-writer cohorts |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['start']} | {r['global-loss-before']:.4f} | {r['lr']} | {r['global-loss-after']:.4f} | "
                     f"{r['rho-mean']:.4f} | {r['rho-cohort-sd']:.4f} |")  # fmt: skip
    lines += ["", "The start probe as B2 runs it (3 rounds, slots x1/9 .. x9): each slot's rho (mean / median), the "
              "factor the probe chose (lowest mean) and the one the median would choose.", "",
              "| start lr | seed | rho by slot, x1/9 .. x9: mean / median | the probe chose | median would |",
              "|---|---|---|---|---|"]  # fmt: skip
    for probe in probes:
        cells = ", ".join(f"{m:.3f} / {d:.3f}" for m, d in zip(probe["means"], probe["medians"], strict=True))
        lines.append(f"| {probe['lr']} | {probe['seed']} | {cells} | x{probe['chosen']:.3g} | "
                     f"x{probe['median-chooses']:.3g} |")
    write_report(RESULTS / "step_signals.json", results, "\n".join(lines) + "\n", stamped=False, indent=1)
    print("\n".join(lines))


def probe_slots(lr: float, seed: int, data: Path) -> dict:
    """B2's start probe from ``lr`` on ``seed``, in process: every reply's rho by slot."""
    config = run_config("fathom", Start("probe", lr, BATCH), seed=seed, rounds=500, data_dir=data) | PROBE
    run = InProcessRun(run_config=config, num_clients=105)
    tuner, by_slot = run.strategy.tuner, {}
    tally = tuner.probe_update

    def watched(replies):  # the tuner's own tally, and each reply's rho kept by slot
        for reply in replies:
            rho = local_progress(float(reply.metrics[TRAIN_LOSS]), float(reply.metrics[START_LOSS]))
            by_slot.setdefault(tuner.slots[reply.partition], []).append(rho)
        return tally(replies)

    tuner.probe_update = watched
    while tuner.probing:
        run.step()
    slots = range(len(tuner.factors))
    means = [float(np.mean(by_slot.get(k, [np.nan]))) for k in slots]
    medians = [float(np.median(by_slot.get(k, [np.nan]))) for k in slots]
    factors = [float(f) for f in tuner.factors]
    print(f"probe from lr {lr}, seed {seed}: chose x{tuner.state.lr / lr:.3g}", flush=True)
    return {"lr": lr, "seed": seed, "factors": factors, "rho": {str(k): by_slot.get(k, []) for k in slots},
            "means": means, "medians": medians, "mean-chooses": factors[int(np.nanargmin(means))],
            "median-chooses": factors[int(np.nanargmin(medians))], "chosen": tuner.state.lr / lr}


if __name__ == "__main__":
    main()
