"""The figures of a run: ``accuracy.png`` (every run) and ``tuning.png`` (a tuned run)."""

from __future__ import annotations

import io
import math
from pathlib import Path

from strategies.rounds.checkpoint import write_atomically


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
    _save_figure(fig, path, dpi=110)


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
    _save_figure(fig, path, dpi=120)


def _save_figure(figure: object, path: Path, *, dpi: int) -> None:
    """Write ``figure`` as a PNG at ``path`` atomically (a link at ``path`` is replaced, not followed), and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    write_atomically(path, buffer.getvalue())
