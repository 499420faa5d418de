"""The result writer: ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` per run.

Created by the ServerApp and handed to the strategy as its recorder, so
strategies never import ``app``.
"""

from __future__ import annotations

import json
import math
import time
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.common.logger import log


def _jsonable(value: object) -> object:
    """NaN/inf become null so every line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def run_directory(results_dir: str, run_name: str, default_name: str) -> Path:
    """``<results-dir>/<run-name>`` as an absolute path; a fresh timestamped name by default.

    A relative ``results-dir`` is resolved against the server process's working
    directory (for ``flwr run .`` that is where the local SuperLink was started).
    """
    name = run_name or f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(results_dir).expanduser().resolve() / name
    suffix = 1
    while not run_name and path.exists():  # two runs in the same second
        path = path.with_name(f"{name}-{suffix}")
        suffix += 1
    return path


class ResultWriter:
    """Writes one run's results; implements the strategies' ``Recorder`` protocol.

    Parameters
    ----------
    run_dir
        The run's folder (created; absolute path logged).
    settings
        The run's settings, copied into ``summary.json``.

    """

    def __init__(self, *, run_dir: Path, settings: dict) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = run_dir / "metrics.jsonl"
        self.metrics_path.write_text("")
        self.rounds: list[dict] = []
        log(INFO, "stamen results: %s", self.run_dir)

    def record_round(self, record: dict) -> None:
        self.rounds.append(record)
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(_jsonable(record)) + "\n")

    def save_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        """``<run_dir>/<name>.npz``, written to a temporary name first so a reader never sees half a file."""
        partial = self.run_dir / f"{name}.partial.npz"
        np.savez_compressed(partial, **arrays)
        partial.replace(self.run_dir / f"{name}.npz")

    def finish(self, summary: dict) -> None:
        payload = {"settings": self.settings, **summary, "results-dir": str(self.run_dir)}
        (self.run_dir / "summary.json").write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
        title = f"{summary.get('strategy')} - {self.run_dir.name}"
        plot_accuracy(self.rounds, self.run_dir / "accuracy.png", title=title)
        log(INFO, "stamen wrote %s, %s and %s", self.metrics_path, "summary.json", "accuracy.png")


def plot_accuracy(rounds: list[dict], path: Path, *, title: str) -> None:
    """Personalised and global accuracy per evaluated round, with the min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in rounds if r.get("accuracy") is not None and math.isfinite(r["accuracy"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    if evaluated:
        x = [r["round"] for r in evaluated]
        ax.plot(x, [r["accuracy"] for r in evaluated], marker="o", label="personalised (mean)")
        ax.fill_between(
            x, [r["accuracy-min"] for r in evaluated], [r["accuracy-max"] for r in evaluated],
            alpha=0.2, label="personalised (min-max over clients)",
        )  # fmt: skip
        ax.plot(x, [r["global-accuracy"] for r in evaluated], marker="s", label="global model (mean)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
