"""B2's setting (FATHOM against FedAvg on FEMNIST), shared by the scripts that rerun it: starts and run config.

``bench/fathom_vs_fedavg.py`` runs it; ``bench/step_signals.py`` reruns its start probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WRITERS, PER_ROUND, MODEL = 105, 10, "cnn-small"

# The tuner's start probe (strategies/tuning/start_probe.py): 3 rounds trying lr x 3^k, k = -2..2, before FATHOM's rule
PROBE = {"fathom-probe-rounds": 3}


@dataclass(frozen=True)
class Start:
    """A starting point: its label and the (lr, batch size) it starts from (epochs 1).

    ``variant`` names settings changed from the paper's (``extra``); "" is the paper's.
    """

    label: str
    lr: float
    batch: int
    variant: str = ""
    extra: tuple[tuple[str, float], ...] = ()


# FATHOM's update alone: every arm ran so before issue 55 made safe ascent the default; an arm that wants it names it
UNGUARDED = {"fathom-safe-ascent": 0.0}


def run_config(method: str, start: Start, *, seed: int, rounds: int, data_dir: Path) -> dict:
    return {
        "strategy": method,
        "dataset": "femnist",
        "data-dir": str(data_dir),
        "partitioner": "natural",
        "model": MODEL,
        "seed": seed,
        "num-server-rounds": rounds,
        "eval-every": rounds,  # federated evaluation once, at the end; the curve comes from central-eval
        "central-eval": True,
        "fraction-fit": (PER_ROUND + 0.5) / WRITERS,  # Flower samples int(fraction * available) clients
        "min-fit-clients": PER_ROUND,
        "fraction-evaluate": 1.0,
        "aggregation": "examples",
        "lr": start.lr,
        "batch-size": start.batch,
        "local-epochs": 1.0,
        "adapt-steps": 0,
    } | (UNGUARDED if method == "fathom" else {}) | dict(start.extra)
