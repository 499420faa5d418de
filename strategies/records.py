"""Round records, progress lines and the end-of-run summary (pure: plain numbers in, dicts and text out)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from strategies.contracts.common import ACCURACY, GLOBAL_ACCURACY, GLOBAL_LOSS, TRAIN_LOSS
from strategies.contracts.contract import Metric
from strategies.screening import Reply
from strategies.summaries import summarise, weighted_mean

# the only fields of a record that differ between identical runs
TIMING_KEYS = ("round-seconds", "elapsed-seconds", "evaluate-seconds")


def fit_totals(replies: Sequence[Reply], specs: Iterable[Metric]) -> dict[str, float | int]:
    """Example-weighted training loss, examples, and the round's sum of every metric declared with a total."""
    weights = [reply.num_examples for reply in replies]
    out: dict[str, float | int] = {
        TRAIN_LOSS: weighted_mean([float(r.metrics.get(TRAIN_LOSS, np.nan)) for r in replies], weights),
        "examples": int(sum(weights)),
    }
    for spec in specs:
        if spec.total:
            out[spec.total] = int(sum(int(r.metrics.get(spec.name, 0)) for r in replies))
    return out


def evaluation_summary(replies: Sequence[tuple[float, int, dict]]) -> dict[str, float | int]:
    """Personalised and global accuracy (weighted mean and spread) over ``(loss, examples, metrics)`` replies."""
    weights = [n for _, n, _ in replies]
    out: dict[str, float | int] = {"eval-clients": len(replies), "loss": weighted_mean([r[0] for r in replies],
                                                                                       weights)}  # fmt: skip
    out.update(summarise(GLOBAL_LOSS, [float(m.get(GLOBAL_LOSS, loss)) for loss, _, m in replies], weights))
    classified = [(n, m) for _, n, m in replies if ACCURACY in m]
    if classified:  # regression clients report losses only
        weights = [n for n, _ in classified]
        out.update(summarise(ACCURACY, [float(m[ACCURACY]) for _, m in classified], weights))
        out.update(summarise(GLOBAL_ACCURACY, [float(m.get(GLOBAL_ACCURACY, np.nan)) for _, m in classified], weights))
    return out


def progress_line(record: dict, num_rounds: int) -> str:
    """One human-readable line per round."""
    parts = [
        f"[round {record['round']}/{num_rounds}]",
        f"fit {record.get('clients-succeeded', 0)}/{record.get('clients-sampled', 0)} ok",
        f"train-loss {record.get(TRAIN_LOSS, float('nan')):.4f}",
    ]
    if ACCURACY in record:
        parts.append(
            f"personalised acc {record[ACCURACY]:.4f} (min {record['accuracy-min']:.3f}, "
            f"max {record['accuracy-max']:.3f}) global acc {record[GLOBAL_ACCURACY]:.4f}"
        )
    elif "loss" in record:
        parts.append(f"test loss {record['loss']:.5f} (un-adapted {record[GLOBAL_LOSS]:.5f})")
    if "central-accuracy" in record:
        parts.append(f"central acc {record['central-accuracy']:.4f}")
    parts.append(f"{record['round-seconds']:.2f} s")
    return " | ".join(parts)


def run_summary(history: list[dict], name: str) -> dict:
    """Final and best metrics of a run, from its round records."""
    evaluated = [r for r in history if ACCURACY in r and np.isfinite(r[ACCURACY])]
    best = max(evaluated, key=lambda r: r[ACCURACY], default=None)
    return {
        "strategy": name,
        "rounds": len(history),
        "total-seconds": history[-1]["elapsed-seconds"] if history else 0.0,
        "final": evaluated[-1] if evaluated else (history[-1] if history else {}),
        "best-accuracy": best[ACCURACY] if best else None,
        "best-round": best["round"] if best else None,
        "clients-failed": int(sum(r.get("clients-failed", 0) for r in history)),
        "grad-evals": int(sum(r.get("grad-evals", 0) for r in history)),
    }


def summary_line(summary: dict) -> str:
    """One human-readable line for the end of a run."""
    final = summary["final"]

    def fmt(value: object) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    return (
        f"{summary['strategy']}: {summary['rounds']} rounds in {summary['total-seconds']:.1f} s; final personalised "
        f"accuracy {fmt(final.get(ACCURACY))} (client mean {fmt(final.get('accuracy-client-mean'))}), global "
        f"accuracy {fmt(final.get(GLOBAL_ACCURACY))}; best personalised {fmt(summary['best-accuracy'])} "
        f"(round {summary['best-round']}); failed or rejected replies {summary['clients-failed']}"
    )
