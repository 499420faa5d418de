"""B1's setting (Per-FedAvg's Table 1), shared by the scripts that rerun it: rows, methods and run config.

``bench/perfedavg_table1.py`` runs it; ``bench/self_tuning.py`` and ``bench/honest_screen.py``
rerun its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.harness import REPO

DEFAULT_DATA = REPO.parent / "shared" / "data" / "mnist-10k"

NUM_USERS, IMAGES_PER_CLASS, BATCH = 50, 34, 40

METHODS = (
    ("FedAvg + update", "fedavg", ""),
    ("Per-FedAvg FO", "perfedavg", "fo"),
    ("Per-FedAvg HF", "perfedavg", "hf"),
    ("Per-FedAvg SO", "perfedavg", "so"),
)


@dataclass(frozen=True)
class Row:
    tau: int
    alpha: float
    variant: str = "standard"
    batch: int = BATCH  # d = d' = d'' and the evaluation batch

    @property
    def label(self) -> str:
        extra = ", diff. hetero." if self.variant == "diff-hetero" else ""
        extra += f", d = {self.batch}" if self.batch != BATCH else ""
        return f"tau = {self.tau}, alpha = {self.alpha}{extra}"


QUICK_ROWS = (Row(10, 0.001), Row(4, 0.05))


def run_config(
    row: Row,
    strategy: str,
    variant: str,
    *,
    beta: float,
    rounds: int,
    seed: int,
    data_dir: Path,
    results: str,
    name: str,
) -> dict:
    config = {
        "strategy": strategy,
        "dataset": "mnist",
        "data-dir": str(data_dir),
        "partitioner": "perfedavg-paper",
        "images-per-class": IMAGES_PER_CLASS,
        "paper-variant": row.variant,
        "model": "mlp",
        "seed": seed,
        "num-server-rounds": rounds,
        "eval-every": max(1, rounds // 2),
        "fraction-fit": 0.2,
        "aggregation": "uniform",
        "local-steps": row.tau,
        "lr": beta,
        "perfedavg-beta": beta,
        "perfedavg-alpha": row.alpha,
        "perfedavg-delta": 1e-3,
        "batch-size": row.batch,
        "perfedavg-outer-batch-size": row.batch,
        "perfedavg-hessian-batch-size": row.batch,
        "adapt-steps": 1,
        "adapt-lr": row.alpha,  # every method, FedAvg + update included, adapts with alpha at test time
        "adapt-batch-size": row.batch,
        "results-dir": results,
        "run-name": name,
    }
    if variant:
        config["perfedavg-variant"] = variant
    return config
