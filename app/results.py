"""The result writer: ``metrics.jsonl``, ``summary.json`` and ``accuracy.png`` per run.

Created by the ServerApp and handed to the strategy as its recorder, so
strategies never import ``app``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from app.provenance import data_provenance
from app.workdir import resolved
from strategies.checkpoint import FILE_NAME, Checkpoint, save_checkpoint


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

    A relative ``results-dir`` is taken under ``~/stamen/`` (:func:`app.workdir.resolved`),
    never under a working directory: with ``flwr run .`` that is the folder where a
    reused local SuperLink was started, which the command does not tell.
    """
    name = run_name or f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = resolved(results_dir).resolve() / name
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
        The run's settings, copied into ``summary.json`` and every checkpoint.
    resume_after
        Continue a run resumed from its checkpoint after this round: the records of
        later rounds (written after the checkpoint, before the run stopped) are
        dropped, since the resumed run repeats those rounds. ``None`` starts afresh.
    provenance
        Which code, versions and machine make the run (:func:`app.provenance.run_provenance`):
        written to ``run.json`` at once and, with the fingerprint of the clients' data,
        into ``summary.json``.

    """

    def __init__(self, *, run_dir: Path, settings: dict, resume_after: int | None = None,
                 provenance: dict | None = None) -> None:  # fmt: skip
        self.run_dir = run_dir
        self.settings = settings
        self.provenance = provenance
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if provenance is not None:  # written first, so even a run that dies early says what made it
            name = "run.json" if resume_after is None else f"run-resumed-after-{resume_after}.json"
            (run_dir / name).write_text(json.dumps({"settings": settings, "provenance": provenance}, indent=2) + "\n")
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rounds: list[dict] = []
        if resume_after is None:
            self.metrics_path.write_text("")
        else:
            self.rounds = [r for r in read_metrics(self.metrics_path) if r["round"] <= resume_after]
            partial = self.metrics_path.with_name(".metrics.jsonl.partial")
            partial.write_text("".join(json.dumps(r) + "\n" for r in self.rounds))
            partial.replace(self.metrics_path)
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

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """``<run_dir>/checkpoint.npz``, atomically, with the run's settings added."""
        state = {**checkpoint.state, "settings": self.settings}
        save_checkpoint(self.run_dir / FILE_NAME, Checkpoint(round=checkpoint.round, arrays=checkpoint.arrays,
                                                             state=_jsonable(state)))  # fmt: skip
        log(INFO, "checkpoint after round %d: %s", checkpoint.round, self.run_dir / FILE_NAME)

    def save_text(self, name: str, text: str) -> str:
        path = self.run_dir / name
        path.write_text(text)
        return str(path)

    def write_summary(self, summary: dict) -> Path:
        """``<run_dir>/summary.json``: the run's settings, ``summary`` and where the results are."""
        payload = {"settings": self.settings, **summary, "results-dir": str(self.run_dir)}
        if self.provenance is not None:
            payload["provenance"] = {**self.provenance, "data": data_provenance(summary.get("nodes", []))}
        path = self.run_dir / "summary.json"
        path.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
        return path

    def fail(self, summary: dict) -> None:
        """``summary.json`` with ``status`` ``failed`` and the reason, so a failed run is told from a running one."""
        log(INFO, "stamen wrote %s (status failed)", self.write_summary(summary))

    def finish(self, summary: dict) -> None:
        self.write_summary(summary)
        title = f"{summary.get('strategy')} - {self.run_dir.name}"
        plot_accuracy(self.rounds, self.run_dir / "accuracy.png", title=title)
        written = ["summary.json", "accuracy.png"]
        if any("H" in r for r in self.rounds):  # a tuned run (fathom, or tune = "fathom")
            plot_tuning(self.rounds, self.run_dir / "tuning.png", title=title)
            written.append("tuning.png")
        log(INFO, "stamen wrote %s, %s", self.metrics_path, ", ".join(written))


def write_refusal(*, run_dir: Path, reason: str, run_config: Mapping[str, object]) -> Path:
    """``<run_dir>/summary.json`` of a run refused before any work: ``status`` ``failed``, ``refused`` and the reason.

    ``flwr run --stream`` exits 0 whatever happens to the run, so a script that reads the
    run's ``summary.json`` finds why here; nothing else is written.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"settings": dict(run_config), "status": "failed", "refused": True, "reason": reason,
               "completed-rounds": 0, "results-dir": str(run_dir)}  # fmt: skip
    path = run_dir / "summary.json"
    path.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
    return path


def read_metrics(path: Path) -> list[dict]:
    """The round records of a ``metrics.jsonl`` (an absent file has none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tuned_values(rounds: list[dict]) -> dict[str, list[float]]:
    """The values in force that changed during a run (``hp-*`` keys), per round: what a tuner moved."""
    first = rounds[0] if rounds else {}
    numeric = {k for k, v in first.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    keys = [k for k in first if k.startswith("hp-") and k in numeric]
    series = {k.removeprefix("hp-"): [float(r.get(k, math.nan)) for r in rounds] for k in keys}
    return {k: v for k, v in series.items() if len(set(v)) > 1}


def plot_tuning(rounds: list[dict], path: Path, *, title: str) -> None:
    """A tuned run's trajectory: every value the tuner moved, and its signals H, G and phi, per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    moved = tuned_values(rounds)
    x = [r["round"] for r in rounds]
    fig, axes = plt.subplots(len(moved) + 1, 1, figsize=(6, 2.2 * (len(moved) + 1)), sharex=True, squeeze=False)
    for ax, (name, values) in zip(axes[:, 0], moved.items(), strict=False):
        ax.plot(x, values)
        ax.set_ylabel(name)
        ax.set_yscale("log" if min(values) > 0 and max(values) / min(values) > 10 else "linear")
        ax.grid(alpha=0.3)
    signals = axes[-1, 0]
    for name in ("H", "G", "phi-mean"):
        signals.plot(x, [r.get(name, math.nan) for r in rounds], label=name)
    signals.set_ylabel("signal")
    signals.set_xlabel("round")
    signals.grid(alpha=0.3)
    probed = [r for r in rounds if "probe-round" in r]
    if probed:  # the tuner's start probe: its rounds shaded, and the factor it chose
        first, last = probed[0]["round"], probed[-1]["round"]
        chosen = next((r["probe-factor"] for r in probed if "probe-factor" in r), None)
        label = f"start probe (chose x{chosen:.3g})" if chosen is not None else "start probe"
        for ax in axes[:, 0]:
            ax.axvspan(first - 0.5, last + 0.5, color="grey", alpha=0.15, lw=0,
                       label=label if ax is signals else None)  # fmt: skip
    decays = [r["round"] for r, before in zip(rounds, [{}, *rounds], strict=False)
              if r.get("lr-decays", 0) > before.get("lr-decays", 0)]  # fmt: skip
    for k, decay in enumerate(decays):  # a decay after round r: the smaller step is in force from r + 1
        for ax in axes[:, 0]:
            ax.axvline(decay + 0.5, color="tab:red", ls=":", lw=1,
                       label="stationarity test: step divided" if ax is signals and k == 0 else None)  # fmt: skip
    signals.legend(loc="best", fontsize=8)
    axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        tested = [r for r in evaluated if "global-accuracy" in r]  # none where the clients keep personal layers
        if tested:
            ax.plot([r["round"] for r in tested], [r["global-accuracy"] for r in tested], marker="s",
                    label="global model (mean)")  # fmt: skip
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
