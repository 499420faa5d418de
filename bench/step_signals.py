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

    python bench/step_signals.py     # about 3 minutes on 2 cores; bench/results/step_signals.json and .md
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import SHARED_DATA, machine  # noqa: E402
from clients.models import build_model  # noqa: E402
from clients.training import axpy, gradient, model_loss, to_tensor  # noqa: E402
from datasets.leaf import load_femnist  # noqa: E402

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
    out = REPO / "bench" / "results"
    results = {"benchmark": "step_signals", "machine": machine(), "seconds": time.perf_counter() - started,
               "batch": BATCH, "probed-writers": len(PROBED), "held-out-writers": len(HELD_OUT), "rows": rows}
    (out / "step_signals.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["One epoch (batch 16) on writers 0-29 from each model, at each lr: the global loss on writers 60-104's "
             "training images after their mean update, and rho = mean local loss / first step's loss.", "",
             "| from | global loss before | lr | global loss after | mean rho | sd of rho over 3-writer cohorts |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['start']} | {r['global-loss-before']:.4f} | {r['lr']} | {r['global-loss-after']:.4f} | "
                     f"{r['rho-mean']:.4f} | {r['rho-cohort-sd']:.4f} |")  # fmt: skip
    (out / "step_signals.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
