"""Checks a client's reply must pass before it may touch the global model (pure numpy).

What a metric may be is declared once, in the contracts (``Metric``: its range, and
whether a reply must carry it); these functions apply the declarations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from strategies.contracts.common import MAX_REASONABLE_LOSS
from strategies.contracts.contract import Metric


@dataclass(frozen=True, eq=False)
class Reply:
    """A client's fit reply that passed screening, decoded once.

    ``partition`` is the partition the server knows the node by; replies are
    combined in partition order, so a run's sums never depend on arrival order.
    ``arrays`` are the model's arrays that travel (all of them, or the shared ones of a
    method with personal layers); ``extras`` the array sets its contract ``returns``.
    """

    node: str
    partition: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: Mapping[str, object]
    extras: Mapping[str, list[np.ndarray]] = field(default_factory=dict)  # the array sets beside the model, by name


NON_FINITE = "non-finite"  # every problem that is about values that are not finite says so


def is_non_finite(problem: str | None) -> bool:
    """Whether a screening problem is about non-finite values (a diverging client, not a broken one)."""
    return problem is not None and NON_FINITE in problem


def metrics_problem(metrics: Mapping[str, object], specs: Mapping[str, Metric]) -> str | None:
    """Why a reply's scalar metrics are absurd (not finite, or outside a declared range), or ``None``."""
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            return f"metric {name!r} is {NON_FINITE} ({value})"
        if name in specs and (problem := specs[name].problem(value)):
            return problem
    return None


def arrays_problem(arrays: Sequence[np.ndarray], expected_shapes: Sequence[tuple[int, ...]]) -> str | None:
    """Why a list of arrays is not what was expected (count, shapes, finite numbers), or ``None``."""
    if len(arrays) != len(expected_shapes):
        return f"{len(arrays)} arrays, expected {len(expected_shapes)}"
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if tuple(array.shape) != tuple(shape):
            return f"array {i} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
            return f"array {i} holds {NON_FINITE} or non-numeric values"
    return None


def fit_reply_problem(
    arrays: Sequence[np.ndarray],
    num_examples: int,
    metrics: Mapping[str, object],
    expected_shapes: Sequence[tuple[int, ...]],
    specs: Mapping[str, Metric],
) -> str | None:
    """Why a training reply must be rejected, or ``None`` when it may be aggregated.

    A reply is rejected when it has the wrong number of arrays, an array of the
    wrong shape, a non-finite value, a non-positive example count, a metric outside
    its declared range, or lacks a metric its method requires.
    """
    if problem := arrays_problem(arrays, expected_shapes):
        return problem
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    missing = [name for name, spec in specs.items() if spec.required and name not in metrics]
    if missing:
        return f"no {missing[0]!r} metric"
    return metrics_problem(metrics, specs)


def extras_problem(
    extras: Mapping[str, Sequence[np.ndarray]], expected: Mapping[str, Sequence[tuple[int, ...]]], method: str
) -> str | None:
    """Why a reply's array sets beside the model are not the ones ``method``'s contract declares, or ``None``.

    ``expected`` maps each declared set to its shapes; a missing set, an undeclared one,
    or a set with a wrong count, shape or a non-finite value is named with the method.
    """
    for name, shapes in expected.items():
        if name not in extras:
            return f"{method} array set {name!r} is missing"
        if problem := arrays_problem(extras[name], shapes):
            return f"{method} array set {name!r}: {problem}"
    undeclared = sorted(set(extras) - set(expected))
    if undeclared:
        return f"array set(s) {undeclared} are not declared by {method}'s contract (it returns {list(expected)})"
    return None


def evaluate_reply_problem(
    loss: float, num_examples: int, metrics: Mapping[str, object], specs: Mapping[str, Metric]
) -> str | None:
    """Why an evaluation reply must be rejected, or ``None`` when it may be aggregated.

    Classifiers report accuracies; regression clients (least squares) report losses only.
    """
    if not math.isfinite(loss) or not 0.0 <= loss <= MAX_REASONABLE_LOSS:
        if not math.isfinite(loss):
            return f"loss {loss} is {NON_FINITE}"
        return f"loss {loss} is not in [0, {MAX_REASONABLE_LOSS:g}]"
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    return metrics_problem(metrics, specs)


def update_norm(arrays: Sequence[np.ndarray], sent: Sequence[np.ndarray]) -> float:
    """``||arrays - sent||``, the Euclidean norm of a reply's update over all its arrays.

    One subtraction and one dot product per array, in the arrays' own precision: a
    screen of scale, not a measurement. Arrays that are not floating point (BatchNorm's
    step counters) are no part of the model's update and are left out.
    """
    total = 0.0
    for array, before in zip(arrays, sent, strict=True):
        if not np.issubdtype(np.asarray(array).dtype, np.floating):
            continue
        step = np.subtract(array, before).ravel()
        total += float(np.dot(step, step))
    return math.sqrt(total)


def outsized(norms: Sequence[float], ratio: float, minimum: int = 3) -> list[bool]:
    """Which updates exceed ``ratio`` times the median norm of the round (none with fewer than ``minimum``).

    The median of a round's updates is what its honest majority moved; a reply far
    beyond it (finite values that would still poison the average) is out of scale.
    ``ratio`` 0 turns the check off.
    """
    if ratio <= 0 or len(norms) < minimum:
        return [False] * len(norms)
    median = float(np.median(norms))
    return [norm > ratio * median for norm in norms]
