"""The data report: what the admitted nodes declared of their data, for the preflight's log lines and ``summary.json``.

Each node declares its examples per split and per class in the preflight
(:class:`strategies.nodes.directory.Declared`); :func:`data_report` lists them by partition,
:func:`data_lines` writes them as log lines (escaped: a node wrote them) and
:func:`ray_nodes` counts the clients per Ray node they ran on.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from strategies.contracts.client_reports import (
    DATA_DIR,
    DATA_FINGERPRINT,
    NUM_TEST,
    NUM_TRAIN,
    PARTITION_ID,
    RAY_NODE,
    TEST_CLASSES,
    TRAIN_CLASSES,
)
from strategies.contracts.payload import Scalar
from strategies.nodes.text import escaped

if TYPE_CHECKING:  # nodes.py reports through this file, so it is imported for the type only
    from strategies.nodes.directory import Declared

    Reported = tuple[dict[str, Scalar], Declared]  # a node's answer, as kept, and what it declared of its data

LISTED_NODES = 10  # the preflight logs one line per node up to this many, else a summary line


def data_report(reported: list[Reported], class_names: tuple[str, ...] = ()) -> list[dict[str, object]]:
    """Every reported node's data, by partition: its data-dir, examples per split, examples per class.

    ``reported`` holds each node's answer, as kept, and what it declared. Classes are named
    by ``class_names`` where given (a user's own data), else by index.
    """
    report = []
    for answer, declared in sorted(reported, key=lambda pair: int(pair[0][PARTITION_ID])):
        entry: dict[str, object] = {"partition": int(answer[PARTITION_ID])}
        if answer.get(DATA_DIR):
            entry[DATA_DIR] = str(answer[DATA_DIR])
        entry.update({NUM_TRAIN: declared.num_train or 0, NUM_TEST: declared.num_test or 0})
        if answer.get(DATA_FINGERPRINT):
            entry[DATA_FINGERPRINT] = str(answer[DATA_FINGERPRINT])
        for key, counts in ((TRAIN_CLASSES, declared.train_classes), (TEST_CLASSES, declared.test_classes)):
            if counts is not None:
                entry[key] = named_counts(counts, class_names)
        if answer.get(RAY_NODE):
            entry[RAY_NODE] = str(answer[RAY_NODE])
        report.append(entry)
    return report


def ray_nodes(reported: list[Reported]) -> dict[str, int]:
    """Admitted clients per Ray node they answered the preflight on (empty outside Ray), most first (escaped)."""
    counts = Counter(escaped(a[RAY_NODE]) for a, _ in reported if a.get(RAY_NODE))
    return dict(counts.most_common())


def named_counts(counts: dict[int, int], class_names: tuple[str, ...] = ()) -> dict[str, int]:
    """``{0: 12, 3: 40}`` -> ``{"0": 12, "3": 40}``, or by name (``{"cat": 12, ...}``) where ``class_names`` name it."""
    return {class_names[index] if index < len(class_names) else str(index): count for index, count in counts.items()}


def data_lines(report: list[dict[str, object]]) -> list[str]:
    """The preflight's log lines on the nodes' data: one per node up to ``LISTED_NODES``, else a summary."""
    if not report:
        return []
    if len(report) > LISTED_NODES:
        sizes = sorted(int(entry[NUM_TRAIN]) for entry in report)
        return [f"{len(report)} clients hold {sizes[0]} to {sizes[-1]} training examples (median "
                f"{sizes[len(sizes) // 2]}); each client's counts are in summary.json"]  # fmt: skip
    lines = []
    for entry in report:
        where = f" ({escaped(entry[DATA_DIR])})" if DATA_DIR in entry else ""
        classes = entry.get(TRAIN_CLASSES)
        held = f"; train classes {', '.join(f'{k} {v}' for k, v in classes.items())}" if classes else ""
        lines.append(f"partition {entry['partition']}{where}: {entry[NUM_TRAIN]} train, {entry[NUM_TEST]} test"
                     f"{held}")  # fmt: skip
    return lines
