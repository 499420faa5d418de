"""Byzantine-robust ways to combine client models: coordinate median, trimmed mean, Krum (pure numpy).

Each function takes the round's models (one list of arrays per client, the same
layers in the same order) and returns one model, or, for Krum, which clients to keep.

- :func:`coordinate_median` and :func:`trimmed_mean`: Yin, Chen, Ramchandran and
  Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
  ICML 2018. Each coordinate is combined on its own.
- :func:`krum_scores` and :func:`krum_choice`: Blanchard, El Mhamdi, Guerraoui and
  Stainer, "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent",
  NeurIPS 2017. Whole models are compared; Krum keeps the one closest to its
  neighbours, multi-Krum the ``m`` closest (the caller averages them).

A layer whose arrays are not floating point (BatchNorm's ``num_batches_tracked``, an
integer counter) is combined as :func:`strategies.aggregation.rules.weighted_average_inplace`
combines it, by the element-wise maximum. Floating layers are computed in float64 and
returned in the layer's dtype.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

Model = list[np.ndarray]


def coordinate_median(models: list[Model]) -> Model:
    """The coordinate-wise median of the models (an even count takes the mean of the two middle values).

    Parameters
    ----------
    models
        One list of arrays per client, layer by layer alike in shape.

    Returns
    -------
    list[numpy.ndarray]
        Per floating layer, ``np.median`` over the clients in float64, cast to the
        layer's dtype; per non-floating layer, the element-wise maximum.

    """
    _check_models(models)
    return _per_layer(models, lambda stacked: np.median(stacked, axis=0))


def trimmed_mean(models: list[Model], *, trim_fraction: float) -> Model:
    """The coordinate-wise trimmed mean: per coordinate, drop the ``k`` largest and ``k`` smallest, average the rest.

    Parameters
    ----------
    models
        One list of arrays per client, layer by layer alike in shape.
    trim_fraction
        ``beta`` in Yin et al.: ``k = floor(trim_fraction * n)`` values are dropped at
        each end, in ``[0, 0.5)``.

    Returns
    -------
    list[numpy.ndarray]
        Per floating layer, the mean of the ``n - 2k`` middle values in float64, cast
        to the layer's dtype; per non-floating layer, the element-wise maximum.

    Raises
    ------
    ValueError
        When ``trim_fraction`` is outside ``[0, 0.5)`` (inside it, ``n - 2k >= 1`` always).

    """
    _check_models(models)
    if not 0.0 <= trim_fraction < 0.5:
        # below 0.5, k = floor(trim_fraction * n) < n / 2, so at least one value always remains
        raise ValueError(f"trim_fraction must be in [0, 0.5) so that a value remains, got {trim_fraction}")
    n = len(models)
    k = int(np.floor(trim_fraction * n))

    def middle_mean(stacked: np.ndarray) -> np.ndarray:
        # a sort along the client axis puts each coordinate's k smallest first and k largest last
        ordered = np.sort(stacked, axis=0)
        return ordered[k : n - k].mean(axis=0)

    return _per_layer(models, middle_mean)


def krum_scores(models: list[Model], *, attackers: int) -> np.ndarray:
    """Each model's Krum score: the sum of its squared distances to its ``n - f - 2`` nearest other models.

    Parameters
    ----------
    models
        One list of arrays per client; each is compared as one vector (its floating
        layers, raveled and concatenated, in float64).
    attackers
        ``f``, the number of Byzantine clients tolerated; Krum needs ``n >= 2f + 3``.

    Returns
    -------
    numpy.ndarray
        ``n`` float64 scores; a model with non-finite values is infinitely far from
        every other, so its score is ``inf`` whenever one of those distances counts.

    Raises
    ------
    ValueError
        When ``attackers`` is negative or ``n < 2f + 3``.

    """
    _check_models(models)
    n = len(models)
    if attackers < 0:
        raise ValueError(f"attackers must be at least 0, got {attackers}")
    if n < 2 * attackers + 3:
        raise ValueError(f"Krum needs n >= 2f + 3 models: n = {n}, f = {attackers} (at most f = {(n - 3) // 2})")
    floating = _floating_layers(models)
    vectors = [np.concatenate([np.asarray(model[i], dtype=np.float64).ravel() for i in floating]) for model in models]
    distances = _squared_distances(vectors)
    neighbours = n - attackers - 2
    # each row without its own zero distance, nearest first
    others = np.sort(distances + np.diag(np.full(n, np.inf)), axis=1)[:, :neighbours]
    return others.sum(axis=1)


def krum_choice(models: list[Model], *, attackers: int, keep: int) -> list[int]:
    """The indices of the ``keep`` models with the lowest Krum scores, lowest first, ties broken by index.

    ``keep = 1`` is Krum; ``keep = m > 1`` is multi-Krum, whose chosen models the
    caller averages.

    Parameters
    ----------
    models
        One list of arrays per client.
    attackers
        ``f``, as in :func:`krum_scores`.
    keep
        How many models to keep, in ``[1, n]``.

    Returns
    -------
    list[int]
        Indices into ``models``.

    Raises
    ------
    ValueError
        When ``keep`` is outside ``[1, n]``, or as :func:`krum_scores` does.

    """
    scores = krum_scores(models, attackers=attackers)
    if not 1 <= keep <= len(models):
        raise ValueError(f"keep must be in [1, {len(models)}], got {keep}")
    return [int(i) for i in np.argsort(scores, kind="stable")[:keep]]


def _check_models(models: list[Model]) -> None:
    if not models:
        raise ValueError("no models to combine")
    layers = {len(model) for model in models}
    if len(layers) != 1:
        raise ValueError(f"models have different numbers of layers: {sorted(layers)}")


def _layer_dtype(arrays: list[np.ndarray]) -> np.dtype:
    """The dtype most models give a layer (ties: the earliest model's), so one odd reply cannot retype it."""
    counts = Counter(np.asarray(a).dtype for a in arrays)
    return max(counts, key=counts.__getitem__)  # max keeps the first of equal counts, in first-seen order


def _per_layer(models: list[Model], combine: Callable[[np.ndarray], np.ndarray]) -> Model:
    """``combine`` over the clients' stacked float64 arrays for floating layers; the maximum for the others."""
    result = []
    for arrays in zip(*models, strict=True):
        dtype = _layer_dtype(list(arrays))
        if np.issubdtype(dtype, np.floating):
            stacked = np.stack([np.asarray(a, dtype=np.float64) for a in arrays])
            with np.errstate(over="ignore", invalid="ignore"):  # an attacker's huge values may overflow
                result.append(np.asarray(combine(stacked)).astype(dtype))
        else:
            result.append(np.asarray(np.max(np.stack(arrays), axis=0)).astype(dtype))
    return result


def _floating_layers(models: list[Model]) -> list[int]:
    """The layers Krum compares: the floating ones (step counters say how long a client trained, not where).

    A layer is floating by :func:`_layer_dtype`, so a reply that retypes it is still
    compared on it; a model with no floating layer is compared on all of them.
    """
    layers = range(len(models[0]))
    floating = [i for i in layers if np.issubdtype(_layer_dtype([m[i] for m in models]), np.floating)]
    return floating or list(layers)


def _squared_distances(vectors: list[np.ndarray]) -> np.ndarray:
    """The ``n x n`` squared Euclidean distances; a pair whose distance is not finite is ``inf`` apart."""
    n = len(vectors)
    distances = np.zeros((n, n))
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(n):
            for j in range(i + 1, n):
                # differences, not ||a||^2 + ||b||^2 - 2ab: no cancellation between close models
                diff = vectors[i] - vectors[j]
                distances[i, j] = distances[j, i] = np.dot(diff, diff)
    distances[~np.isfinite(distances)] = np.inf
    return distances


def centered_clip(models: list[Model], center: Model, *, radius: float, iterations: int = 1) -> Model:
    """Centered clipping: from ``center``, the mean of every model's step clipped to ``radius``, ``iterations`` times.

    Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust Optimization",
    ICML 2021: ``v <- v + (1/n) sum_i (x_i - v) min(1, radius / ||x_i - v||)``, starting at
    the previous aggregate (here the global model the replies started from). An attacker
    moves the result at most ``radius / n`` per iteration, however far it sends its model.

    Parameters
    ----------
    models
        One list of arrays per client; the floating layers are clipped as one vector.
    center
        Where the clipping starts, layer by layer alike in shape.
    radius
        The clipping radius ``tau`` (> 0); ``0``: the median of the distances ``||x_i - center||``
        (a radius that leaves half the replies whole, whatever the models' scale).
    iterations
        ``L`` in the paper (>= 1); one is what it runs with server momentum.

    Returns
    -------
    list[numpy.ndarray]
        Floating layers in their dtype; non-floating layers the element-wise maximum.

    """
    _check_models(models)
    if radius < 0 or iterations < 1:
        raise ValueError(f"centered clipping needs radius >= 0 and iterations >= 1, got {radius}, {iterations}")
    floating = [i for i in _floating_layers(models) if np.issubdtype(_layer_dtype([m[i] for m in models]), np.floating)]
    shapes = [np.shape(center[i]) for i in floating]
    vectors = np.stack([np.concatenate([np.asarray(m[i], dtype=np.float64).ravel() for i in floating]) for m in models])
    v = np.concatenate([np.asarray(center[i], dtype=np.float64).ravel() for i in floating])
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(iterations):
            steps = vectors - v
            norms = np.sqrt(np.einsum("ij,ij->i", steps, steps))
            tau = float(np.median(norms[np.isfinite(norms)])) if radius == 0 else radius
            scale = np.where(norms > tau, tau / np.where(norms > 0, norms, 1.0), 1.0)
            scale[~np.isfinite(norms)] = 0.0  # a non-finite model moves nothing
            v = v + (np.nan_to_num(steps, nan=0.0, posinf=0.0, neginf=0.0) * scale[:, None]).mean(axis=0)
    clipped, start = {}, 0
    for i, shape in zip(floating, shapes, strict=True):
        size = int(np.prod(shape))
        clipped[i] = v[start : start + size].reshape(shape).astype(_layer_dtype([m[i] for m in models]))
        start += size
    # the other layers (step counters) as every rule combines them: the element-wise maximum
    return [clipped[i] if i in clipped else np.asarray(np.max(np.stack([m[i] for m in models]), axis=0))
            .astype(_layer_dtype([m[i] for m in models])) for i in range(len(models[0]))]  # fmt: skip


def bucket_means(models: list[Model], weights: list[float], *, size: int,
                 rng: np.random.Generator) -> tuple[list[Model], list[float]]:  # fmt: skip
    """Bucketing: the models in a random order, averaged ``size`` at a time; the bucket means and their weights.

    Karimireddy, He and Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via
    Bucketing", ICLR 2022: a robust rule applied to the means of ``ceil(n / size)`` random
    buckets instead of the ``n`` models, which shrinks the honest models' spread (what
    median and Krum mistake for an attack under heterogeneous data) by about ``sqrt(size)``.
    Each bucket's mean is weighted by ``weights`` within it, and the bucket weighs their sum.
    """
    _check_models(models)
    if size < 1:
        raise ValueError(f"bucket size must be >= 1, got {size}")
    order = rng.permutation(len(models))
    buckets, bucket_weights = [], []
    for start in range(0, len(models), size):
        members = [int(i) for i in order[start : start + size]]
        total = sum(weights[i] for i in members)
        shares = [weights[i] / total if total > 0 else 1.0 / len(members) for i in members]
        buckets.append(_per_layer([models[i] for i in members],
                                  lambda stacked, shares=shares: np.tensordot(shares, stacked, axes=1)))  # fmt: skip
        bucket_weights.append(total)
    return buckets, bucket_weights
