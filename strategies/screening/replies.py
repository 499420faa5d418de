"""Checks a client's reply must pass before it may touch the global model (pure numpy).

What a metric may be is declared once, in the contracts (``Metric``: its range, and
whether a reply must carry it); these functions apply the declarations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from strategies.contracts.client_reports import MAX_REASONABLE_LOSS
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


@dataclass(frozen=True, eq=False)
class Received:
    """A fit reply as it came, before any check: its node, its arrays (packed, as bytes), example count and metrics.

    The arrays are the model's then each returned set's, as the layout under ``payload`` in
    ``metrics`` says (:mod:`strategies.contracts.payload`); none of it is believed yet.
    """

    node: str
    tensors: list[bytes]
    num_examples: object
    metrics: Mapping[str, object]


@dataclass(frozen=True, eq=False)
class Evaluation:
    """An evaluate reply as it came, before any check: its node, loss, example count and metrics."""

    node: str
    loss: object
    num_examples: object
    metrics: Mapping[str, object]


NON_FINITE = "non-finite"  # every problem that is about values that are not finite says so


def is_non_finite(problem: str | None) -> bool:
    """Whether a screening problem is about non-finite values (a diverging client, not a broken one)."""
    return problem is not None and NON_FINITE in problem


def is_real_number(value: object) -> bool:
    """Whether ``value`` is an int or a float, and not a bool (``True`` is an int to Python, not a measurement)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def metrics_problem(metrics: Mapping[str, object], specs: Mapping[str, Metric]) -> str | None:
    """Why a reply's scalar metrics are absurd (not finite, not a number where declared, out of range), or ``None``.

    A declared metric must be an int or a float: a string that parses as a number, or a
    bool, is a client that does not follow the contract, not a value to convert.
    """
    for name, value in metrics.items():
        if is_real_number(value) and not math.isfinite(value):
            return f"metric {name!r} is {NON_FINITE} ({value})"
        if name in specs and not is_real_number(value):
            return f"metric {name!r} = {value!r} is a {type(value).__name__}, not a number"
        if name in specs and (problem := specs[name].problem(value)):
            return problem
    return None


def arrays_problem(
    arrays: Sequence[np.ndarray],
    expected_shapes: Sequence[tuple[int, ...]],
    expected_dtypes: Sequence[np.dtype] | None = None,
    *,
    name: str = "model",
) -> str | None:
    """Why a list of arrays is not what was sent (count, shapes, dtypes, finite numbers), or ``None``.

    ``expected_dtypes`` are those of the server's own arrays: a reply's array must have
    exactly that dtype. An integer reply to a float model, a float64 one to a float32
    model (1e300 is finite in float64 and inf once cast), a float16 or complex one would
    otherwise pass and set the global model's values or its dtype. ``name`` is the
    array set's, for the message.
    """
    if len(arrays) != len(expected_shapes):
        return f"{len(arrays)} arrays, expected {len(expected_shapes)}"
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if tuple(array.shape) != tuple(shape):
            return f"array {i} has shape {tuple(array.shape)}, expected {tuple(shape)}"
        if expected_dtypes is not None and np.dtype(array.dtype) != np.dtype(expected_dtypes[i]):
            return f"{name} array {i} is {array.dtype}, the server sent {np.dtype(expected_dtypes[i])}"
        if not np.issubdtype(array.dtype, np.number) or not np.all(np.isfinite(array)):
            return f"array {i} holds {NON_FINITE} or non-numeric values"
    return None


def fit_reply_problem(
    arrays: Sequence[np.ndarray],
    num_examples: int,
    metrics: Mapping[str, object],
    expected_shapes: Sequence[tuple[int, ...]],
    specs: Mapping[str, Metric],
    expected_dtypes: Sequence[np.dtype] | None = None,
    *,
    examples_limit: int | None = None,
) -> str | None:
    """Why a training reply must be rejected, or ``None`` when it may be aggregated.

    A reply is rejected when it has the wrong number of arrays, an array of the
    wrong shape or dtype, a non-finite value, an example count that is not a positive
    integer or exceeds what its node declared (``examples_limit``: the preflight's
    ``num-train``, when known), a metric that is not a number or is outside its
    declared range, or lacks a metric its method requires.
    """
    if problem := arrays_problem(arrays, expected_shapes, expected_dtypes):
        return problem
    if problem := examples_problem(num_examples, examples_limit, "num-train"):
        return problem
    missing = [name for name, spec in specs.items() if spec.required and name not in metrics]
    if missing:
        return f"no {missing[0]!r} metric"
    return metrics_problem(metrics, specs)


def examples_problem(num_examples: object, limit: int | None, declared_as: str) -> str | None:
    """Why a reply's example count cannot be believed, or ``None``.

    The count weighs the reply in every average by examples: it must be a positive
    integer no larger than what the node declared in the preflight (``limit``, under the
    property ``declared_as``), or one reply claiming 2**62 examples takes all the weight.
    """
    if not isinstance(num_examples, (int, np.integer)) or isinstance(num_examples, bool):
        return f"example count {num_examples!r} is not an integer"
    if num_examples <= 0:
        return f"non-positive example count {num_examples}"
    if limit is not None and num_examples > limit:
        return f"example count {num_examples} exceeds the {limit} the node declared ({declared_as})"
    return None


def extras_problem(
    extras: Mapping[str, Sequence[np.ndarray]],
    expected: Mapping[str, Sequence[tuple[int, ...]]],
    method: str,
    dtypes: Mapping[str, Sequence[np.dtype]] | None = None,
) -> str | None:
    """Why a reply's array sets beside the model are not the ones ``method``'s contract declares, or ``None``.

    ``expected`` maps each declared set to its shapes, ``dtypes`` (when given) to its
    dtypes; a missing set, an undeclared one, or a set with a wrong count, shape, dtype
    or a non-finite value is named with the method.
    """
    for name, shapes in expected.items():
        if name not in extras:
            return f"{method} array set {name!r} is missing"
        if problem := arrays_problem(extras[name], shapes, None if dtypes is None else dtypes[name], name=name):
            return f"{method} array set {name!r}: {problem}"
    undeclared = sorted(set(extras) - set(expected))
    if undeclared:
        return f"array set(s) {undeclared} are not declared by {method}'s contract (it returns {list(expected)})"
    return None


def evaluate_reply_problem(
    loss: float,
    num_examples: int,
    metrics: Mapping[str, object],
    specs: Mapping[str, Metric],
    *,
    examples_limit: int | None = None,
) -> str | None:
    """Why an evaluation reply must be rejected, or ``None`` when it may be aggregated.

    Classifiers report accuracies; regression clients (least squares) report losses only.
    The example count weighs the reply's accuracy in the round's mean: it may not exceed
    the node's declared ``num-test`` (``examples_limit``, when known).
    """
    if not is_real_number(loss):
        return f"loss {loss!r} is a {type(loss).__name__}, not a number"
    if not math.isfinite(loss) or not 0.0 <= loss <= MAX_REASONABLE_LOSS:
        if not math.isfinite(loss):
            return f"loss {loss} is {NON_FINITE}"
        return f"loss {loss} is not in [0, {MAX_REASONABLE_LOSS:g}]"
    if problem := examples_problem(num_examples, examples_limit, "num-test"):
        return problem
    return metrics_problem(metrics, specs)


def update_norm(arrays: Sequence[np.ndarray], sent: Sequence[np.ndarray], *, counters: bool = False) -> float:
    """``||arrays - sent||``, the Euclidean norm of a reply's update, in float64.

    ``counters=False`` measures the floating-point arrays (the model's weights);
    ``counters=True`` the integer ones (BatchNorm's step counters), whose change is a
    count of steps on another scale: mixed into one norm, a counter's 50 steps would
    hide a hundredfold change of the weights. The screen compares each with its own
    round median. float64 throughout, so a float32 reply near its largest value has a
    finite norm and integers cannot wrap.
    """
    total = 0.0
    for array, before in zip(arrays, sent, strict=True):
        is_float = np.issubdtype(np.asarray(array).dtype, np.floating)
        if is_float == counters or not np.issubdtype(np.asarray(array).dtype, np.number):
            continue
        step = (np.asarray(array, dtype=np.float64) - np.asarray(before, dtype=np.float64)).ravel()
        total += float(np.dot(step, step))
    return math.sqrt(total)


def set_norm(arrays: Sequence[np.ndarray]) -> float:
    """``||arrays||`` in float64: the scale of an array set that is a change or a value in itself (not a model)."""
    return math.sqrt(sum(float(np.dot(a.ravel(), a.ravel())) for a in (np.asarray(x, np.float64) for x in arrays)))


def counts_problem(arrays: Sequence[np.ndarray], *, total_limit: int | None,
                   per_class_limit: Mapping[int, int] | None = None) -> str | None:  # fmt: skip
    """Why an array set of counts cannot be believed, or ``None``.

    Counts are non-negative whole numbers; their sum may not exceed what the node declared
    (``total_limit``: its ``num-train``) and, where it declared its classes
    (``per_class_limit``: class index -> examples), each class's count may not exceed its
    own (a count laid out per class: row ``j`` is class ``j``).
    """
    values = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)
    if np.any(values < 0) or np.any(values != np.round(values)):
        return "counts must be non-negative whole numbers"
    if total_limit is not None and values.sum() > total_limit:
        return f"counts sum to {values.sum():.0f}, more than the {total_limit} examples the node declared (num-train)"
    if per_class_limit is not None and len(arrays) == 1 and np.asarray(arrays[0]).ndim == 1:
        for j, count in enumerate(np.asarray(arrays[0], dtype=np.float64)):
            if count > per_class_limit.get(j, 0):
                return f"class {j}'s count {count:.0f} exceeds the {per_class_limit.get(j, 0)} the node declared"
    return None


def outsized(norms: Sequence[float], ratio: float, minimum: int = 3) -> list[bool]:
    """Which updates exceed ``ratio`` times the median norm of the round (none with fewer than ``minimum``).

    The median of a round's updates is what its honest majority moved; a reply far
    beyond it (finite values that would still poison the average) is out of scale. A
    non-finite norm is always out of scale. ``ratio`` 0 turns the check off, and a round
    whose median is 0 (nothing moved) has no scale to compare with.
    """
    if ratio <= 0 or len(norms) < minimum:
        return [not math.isfinite(norm) for norm in norms]
    median = float(np.median(norms))
    if not math.isfinite(median) or median == 0.0:
        return [not math.isfinite(norm) for norm in norms]
    return [not math.isfinite(norm) or norm > ratio * median for norm in norms]
