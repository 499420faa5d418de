"""Round records, progress lines and the end-of-run summary (pure: plain numbers in, dicts and text out)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from strategies.contracts.client_reports import ACCURACY, GLOBAL_ACCURACY, GLOBAL_LOSS, TRAIN_LOSS
from strategies.contracts.contract import Metric
from strategies.rounds.summaries import summarise, weighted_mean
from strategies.screening.replies import Reply

# the only fields of a record that differ between identical runs
TIMING_KEYS = ("round-seconds", "elapsed-seconds", "evaluate-seconds")


def fit_summary(replies: Sequence[Reply], specs: Iterable[Metric]) -> dict[str, float | int]:
    """The round's examples and, for every declared metric, the statistics its ``summary`` asks for.

    A mean is weighted by example count over the replies that carry the metric; a sum
    counts a missing value as 0 and stays an integer when every value is one; a metric
    no reply carries gets only its sum (0), no mean, min or max.
    """
    out: dict[str, float | int] = {"examples": int(sum(reply.num_examples for reply in replies))}
    for spec in specs:
        carried = [(reply.metrics[spec.name], reply.num_examples) for reply in replies if spec.name in reply.metrics]
        values = [value for value, _ in carried]
        for statistic, key in spec.record_keys().items():
            if statistic == "sum":
                integral = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
                out[key] = int(sum(values)) if integral else float(sum(float(v) for v in values))
            elif values:
                numbers = [float(v) for v in values]
                if statistic == "mean":
                    out[key] = weighted_mean(numbers, [examples for _, examples in carried])
                else:
                    out[key] = min(numbers) if statistic == "min" else max(numbers)
    return out


def evaluation_summary(replies: Sequence[tuple[float, int, dict]]) -> dict[str, float | int]:
    """Personalised and global accuracy (weighted mean and spread) over ``(loss, examples, metrics)`` replies.

    The global model's metrics are summarised over the replies that carry them: a
    client whose method keeps personal layers has no global model to test, and sends none.
    """
    weights = [n for _, n, _ in replies]
    out: dict[str, float | int] = {"eval-clients": len(replies), "loss": weighted_mean([r[0] for r in replies],
                                                                                       weights)}  # fmt: skip
    for name in (ACCURACY, GLOBAL_LOSS, GLOBAL_ACCURACY):  # regression clients report losses only
        carried = [(n, float(m[name])) for _, n, m in replies if name in m]
        if carried:
            out.update(summarise(name, [v for _, v in carried], [n for n, _ in carried]))
    return out


def progress_line(record: dict, num_rounds: int) -> str:
    """One human-readable line per round."""
    parts = [
        f"[round {record['round']}/{num_rounds}]",
        f"fit {record.get('clients-succeeded', 0)}/{record.get('clients-sampled', 0)} ok",
        f"train-loss {record.get(TRAIN_LOSS, float('nan')):.4f}",
    ]
    if ACCURACY in record:
        shown = (f"personalised acc {record[ACCURACY]:.4f} (min {record['accuracy-min']:.3f}, max "
                 f"{record['accuracy-max']:.3f})")  # fmt: skip
        if GLOBAL_ACCURACY in record:
            shown += f" global acc {record[GLOBAL_ACCURACY]:.4f}"
        parts.append(shown)
    elif "loss" in record:
        unadapted = f" (un-adapted {record[GLOBAL_LOSS]:.5f})" if GLOBAL_LOSS in record else ""
        parts.append(f"test loss {record['loss']:.5f}{unadapted}")
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

    tested = GLOBAL_ACCURACY in final or ACCURACY not in final  # a method with personal layers tests no global model
    shown_global = f"global accuracy {fmt(final.get(GLOBAL_ACCURACY))}" if tested else "no global model tested"
    return (
        f"{summary['strategy']}: {summary['rounds']} rounds in {summary['total-seconds']:.1f} s; final personalised "
        f"accuracy {fmt(final.get(ACCURACY))} (client mean {fmt(final.get('accuracy-client-mean'))}), "
        f"{shown_global}; best personalised {fmt(summary['best-accuracy'])} "
        f"(round {summary['best-round']}); failed or rejected replies {summary['clients-failed']}"
    )
