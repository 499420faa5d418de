"""Model arrays <-> one flat vector, for strategies that do maths on whole models (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from strategies.aggregation import robust
from strategies.contracts.common import AVERAGES, ROBUST


def flatten(arrays: list[np.ndarray], dtype: type = np.float32) -> np.ndarray:
    """All arrays, raveled and concatenated in order, as ``dtype``."""
    return np.concatenate([a.astype(dtype).ravel() for a in arrays])


def unflatten(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The inverse of :func:`flatten` for arrays of ``shapes``."""
    sizes = [int(np.prod(s)) for s in shapes]
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    return [part.reshape(shape) for part, shape in zip(parts, shapes, strict=True)]


def weighted_average_inplace(
    models: list[list[np.ndarray]], weights: list[float], *, float_layers: Sequence[bool] | None = None
) -> list[np.ndarray]:
    """``sum_i w_i x_i / sum_i w_i`` per floating-point layer, overwriting the inputs; non-float layers take the max.

    The same operations, in the same order, as Flower's ``aggregate_inplace`` (scale
    each model by its share in place, then add them up in reply order), so results
    are bit-for-bit those of ``FedAvg(inplace=True)``; it works on models already
    decoded, so each reply is decoded once per round instead of twice.

    An array that is not floating point (BatchNorm's ``num_batches_tracked``, an integer
    counter; a boolean mask) is never averaged: scaling an integer by a share below 1
    truncates it to 0. Its result is the element-wise maximum over the models (for a
    counter: the largest count any client reached). Which layers are floating point is
    ``float_layers`` (the server's own model's) when given, else read from ``models[0]``.
    """
    floats = [np.issubdtype(x.dtype, np.floating) for x in models[0]] if float_layers is None else list(float_layers)
    if not all(floats):
        counted = {i: np.asarray(np.max([model[i] for model in models], axis=0)) for i, f in enumerate(floats) if not f}
        averaged = weighted_average_inplace([[x for x, f in zip(m, floats, strict=True) if f] for m in models], weights,
                                            float_layers=[True] * sum(floats))  # fmt: skip
        rest = iter(averaged)
        return [counted[i] if i in counted else next(rest) for i in range(len(floats))]
    if not models[0]:
        return []
    total = sum(weights)
    shares = np.asarray([w / total for w in weights])

    def scaled(x: np.ndarray, share: np.float64) -> np.ndarray:
        if np.can_cast(share, x.dtype, casting="same_kind"):
            return np.multiply(x, share, out=x)
        return np.multiply(x, np.array(share, x.dtype), out=x)

    layers = [scaled(x, shares[0]) for x in models[0]]
    for i, model in enumerate(models[1:], start=1):
        layers = [np.add(acc, scaled(x, shares[i]), out=acc) for acc, x in zip(layers, model, strict=True)]
    return layers


def aggregate(
    models: list[list[np.ndarray]],
    weights: list[float],
    *,
    rule: str,
    trim_fraction: float = 0.1,
    attackers: int = 1,
    float_layers: Sequence[bool] | None = None,
    bucket_size: int = 1,
    rng: np.random.Generator | None = None,
    center: list[np.ndarray] | None = None,
    clip_radius: float = 0.0,
) -> list[np.ndarray]:
    """The round's combination of ``models`` under ``rule`` (the run config's ``aggregation``).

    ``examples`` and ``uniform`` are the weighted mean (``weights`` are the example counts
    or ones); ``median`` is the coordinate-wise median and ``trimmed-mean`` drops the
    ``trim_fraction`` largest and smallest values of every coordinate (Yin et al., ICML
    2018); ``krum`` keeps the one model nearest its ``n - f - 2`` neighbours and
    ``multi-krum`` averages (by ``weights``) the ``n - f`` best by that score (Blanchard
    et al., NeurIPS 2017), ``f`` being ``attackers``. Krum needs ``n >= 2f + 3`` replies:
    a round with fewer assumes as many attackers as it can (logged), and with fewer than
    3 replies takes the median. ``centered-clip`` starts at ``center`` (the model the replies
    started from; the coordinate median where none is given) and adds the mean of every
    model's step clipped to ``clip_radius`` (0: the median step; Karimireddy et al., ICML
    2021). With ``bucket_size`` > 1 a robust rule combines the means of random buckets of that
    many models (``rng`` draws them; Karimireddy et al., ICLR 2022). Non-float layers
    (``float_layers``) take the element-wise maximum under every rule.
    """
    if rule in AVERAGES:
        return weighted_average_inplace(models, weights, float_layers=float_layers)
    if rule not in ROBUST:
        raise ValueError(f"aggregation {rule!r} is not one of {AVERAGES + ROBUST}")
    if bucket_size > 1 and len(models) > 1:
        models, weights = robust.bucket_means(models, weights, size=bucket_size, rng=rng or np.random.default_rng(0))
    if rule == "median":
        return robust.coordinate_median(models)
    if rule == "trimmed-mean":
        return robust.trimmed_mean(models, trim_fraction=trim_fraction)
    if rule == "centered-clip":
        return robust.centered_clip(models, center if center is not None else robust.coordinate_median(models),
                                    radius=clip_radius)  # fmt: skip
    if len(models) < 3:
        return robust.coordinate_median(models)
    feasible = min(attackers, (len(models) - 3) // 2)
    if feasible < attackers:
        log(WARNING, "%s: %d replies allow at most %d attacker(s) (krum-attackers %d needs %d); assuming %d", rule,
            len(models), feasible, attackers, 2 * attackers + 3, feasible)  # fmt: skip
    if rule == "krum":
        return [np.array(x, copy=True) for x in models[robust.krum_choice(models, attackers=feasible, keep=1)[0]]]
    kept = robust.krum_choice(models, attackers=feasible, keep=len(models) - feasible)
    return weighted_average_inplace([models[i] for i in kept], [weights[i] for i in kept], float_layers=float_layers)


def all_finite(arrays: list[np.ndarray]) -> bool:
    """Whether every floating-point value of ``arrays`` is finite (integer arrays always are)."""
    return all(np.all(np.isfinite(a)) for a in arrays if np.issubdtype(a.dtype, np.floating))
