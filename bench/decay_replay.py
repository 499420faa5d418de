"""When would each window test first halve the step? Replayed on the recorded ``H`` of B2's and B5's runs.

Up to a test's first decay a tuned run is the same run with or without it (the test only
reads ``H``), so the round of the first decay is exact when the tests are replayed on a
recorded run's ``H``: the stationarity test (``fathom-decay-test = "stationary"``) and the
overshoot test (``"overshoot"``), each with ``fathom-decay-window = 5``, without the loss gate
(the older runs did not record the loss). With the gate a test fires at the same round or
later. Beside each: B2's round to the target and the round of peak accuracy (a collapse
follows the peak in the runs from lr 0.3), B5's final accuracy.

    python -m bench.decay_replay     # a second; bench/results/decay_replay.json and .md
"""

from __future__ import annotations

import ast
import json

import numpy as np

from bench.harness import RESULTS, write_report
from strategies.tuning.stationarity import overshooting, stationary

WINDOW = 5
TESTS = {"stationary": stationary, "overshoot": overshooting}
B2_TARGET = 0.7968  # B2's target: 95% of tuned FedAvg's plateau (bench/results/fathom_vs_fedavg.json)


def parsed(value: object) -> object:
    """A run log's field: stored as JSON, or as the repr of a Python value in the older B2 lines."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def first_decay(h: list[float], test: str, window: int = WINDOW) -> int | None:
    """The first round after which ``test`` fires on the last ``window`` values of ``H`` (round 1's ``H`` is none)."""
    values = [float(v) for v in h[1:]]
    for end in range(window, len(values) + 1):
        if TESTS[test](np.array(values[end - window : end])):
            return end + 1  # values[0] is round 2's H
    return None


def b2_rows() -> list[dict]:
    rows = []
    for line in (RESULTS / "fathom_vs_fedavg_runs.jsonl").read_text().splitlines():
        run = json.loads(line)
        trajectory = parsed(run["trajectory"])
        if run["method"] != "fathom" or run.get("variant") or "H" not in trajectory:
            continue  # FATHOM as published only: the variants' H after their own decays is not the rule's
        accuracy = [a for _, a in parsed(run["curve"])]
        reached = next((i + 1 for i, a in enumerate(accuracy) if a >= B2_TARGET), None)
        rows.append({"benchmark": "B2", "run": f"fathom from lr {run['lr']}, batch {run['batch']}",
                     "seed": int(run["seed"]), "round to target": reached,
                     "peak round": int(np.argmax(accuracy)) + 1, "peak accuracy": round(max(accuracy), 4),
                     **{f"{test} fires after": first_decay(trajectory["H"], test) for test in TESTS}})  # fmt: skip
    return rows


def b5_rows() -> list[dict]:
    rows = []
    for line in (RESULTS / "self_tuning_runs.jsonl").read_text().splitlines():
        run = json.loads(line)
        label = run["label"]
        if "+ tuner from" not in label:  # the tuner as published: no probe, no test
            continue
        rows.append({"benchmark": "B5", "run": label, "seed": int(run["seed"]),
                     "accuracy": round(float(run["accuracy"]), 4),
                     **{f"{test} fires after": first_decay(parsed(run["H"]), test) for test in TESTS}})  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    out = [f"First decay of each test (window {WINDOW}, no gate), replayed on the recorded H; '-': never.", ""]
    for benchmark, extra in (("B2", ("round to target", "peak round", "peak accuracy")), ("B5", ("accuracy",))):
        columns = ("run", "seed", *extra, *(f"{test} fires after" for test in TESTS))
        out += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join("-" if r[c] is None else str(r[c]) for c in columns) + " |"
                for r in rows if r["benchmark"] == benchmark]  # fmt: skip
        out.append("")
    return "\n".join(out)


def main() -> None:
    order = lambda row: (row["run"], row["seed"])  # noqa: E731
    rows = sorted(b2_rows(), key=order) + sorted(b5_rows(), key=order)
    write_report(RESULTS / "decay_replay.json", {"window": WINDOW, "rows": rows}, markdown(rows), stamped=False,
                 indent=1)  # fmt: skip
    print(markdown(rows))


if __name__ == "__main__":
    main()
