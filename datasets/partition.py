"""Partitioners: turn one dataset into per-client train and test index sets.

Every partitioner is a pure function of the labels and a seeded generator. Where
the source has a test set, the test pool is split with the same rule (and, for
label-skewed rules, the same per-client class mix), so each client's test split
follows its own training distribution, which personalised evaluation needs.
Sources without a test set get a per-client held-out fraction instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from datasets.base import ArraySource, ClientSplit, NotEnoughDataError

PARTITIONERS = ("iid", "dirichlet", "shards", "perfedavg-paper", "natural", "pfllib-pathological", "pfllib-practical")
# PFLlib's rules (its dataset_utils.separate_data, 'pat' and 'dir'): the source's test set is pooled with its
# training set, the pool is split over the clients, and each client holds out test-fraction of its share (PFLlib: 25%)
POOLED = ("pfllib-pathological", "pfllib-practical")
# PFLlib's earlier rule for the practical split: every client holds one batch of 10 test examples at a 75/25 split
PRACTICAL_MIN_EXAMPLES = 40
PAPER_VARIANTS = ("standard", "diff-hetero")
PAPER_CLASSES = 10
DIRICHLET_MAX_DRAWS = 100


@dataclass(frozen=True)
class PartitionSpec:
    """How to split a source across clients.

    Attributes
    ----------
    name
        One of ``PARTITIONERS``.
    num_clients
        Number of partitions (Flower's ``num-partitions``).
    seed
        Seeds every random choice, so a spec always gives the same split.
    images_per_class
        ``a`` of the ``perfedavg-paper`` split (even).
    paper_variant
        ``standard`` or ``diff-hetero`` (the second half drop their a/2 images).
    concentration
        Dirichlet concentration; small values give strong label skew.
    classes_per_client
        Distinct classes each client holds under ``shards``.
    test_fraction
        Per-client held-out fraction when the source has no test set, and under the
        pooled rules (``POOLED``), which ignore the source's own train/test boundary.
    feature_shift
        ``none``, or ``colour``: each client's images under a colour transform of its
        own (:mod:`datasets.feature_shift`), applied when a client's arrays are taken.

    """

    name: str
    num_clients: int
    seed: int = 0
    images_per_class: int = 8
    paper_variant: str = "standard"
    concentration: float = 0.5
    classes_per_client: int = 2
    test_fraction: float = 0.2
    feature_shift: str = "none"


# --------------------------------------------------------------------------- rules


def paper_counts(num_clients: int, images_per_class: int, variant: str) -> np.ndarray:
    """Images of each class per user for the Per-FedAvg paper's split (BENCHMARKS B1).

    Users ``0 .. n/2-1`` hold ``a`` images of each class 0-4; user ``n/2 + j`` holds
    ``a/2`` images of class ``j % 5`` (none under ``diff-hetero``) and ``a`` images
    of class ``5 + (j // 5) % 5``.

    Returns
    -------
    numpy.ndarray
        ``(num_clients, 10)`` integer counts.

    """
    if num_clients < 2 or num_clients % 2:
        raise ValueError(f"perfedavg-paper needs an even number of clients >= 2, got {num_clients}")
    if images_per_class < 2 or images_per_class % 2:
        raise ValueError(f"images-per-class must be even and >= 2, got {images_per_class}")
    if variant not in PAPER_VARIANTS:
        raise ValueError(f"paper-variant {variant!r} is not one of {PAPER_VARIANTS}")
    a, half = images_per_class, num_clients // 2
    counts = np.zeros((num_clients, PAPER_CLASSES), dtype=np.int64)
    counts[:half, :5] = a
    for j in range(half):
        if variant == "standard":
            counts[half + j, j % 5] = a // 2
        counts[half + j, 5 + (j // 5) % 5] = a
    return counts


def split_by_counts(labels: np.ndarray, counts: np.ndarray, seed: int, pool: str) -> list[np.ndarray]:
    """Shuffle each class pool once and hand out ``counts[k, c]`` images in user order."""
    rng = np.random.default_rng(seed)
    per_client: list[list[np.ndarray]] = [[] for _ in range(len(counts))]
    for c in range(counts.shape[1]):
        pool_c = rng.permutation(np.flatnonzero(labels == c))
        needed = int(counts[:, c].sum())
        if needed > len(pool_c):
            raise NotEnoughDataError(
                f"the {pool} pool holds {len(pool_c)} images of class {c} but the split needs "
                f"{needed}; use fewer clients or a smaller images-per-class"
            )
        bounds = np.concatenate([[0], np.cumsum(counts[:, c])])
        for k in range(len(counts)):
            per_client[k].append(pool_c[bounds[k] : bounds[k + 1]])
    return [np.sort(np.concatenate(parts)) for parts in per_client]


def split_by_proportions(labels: np.ndarray, shares: np.ndarray, seed: int) -> list[np.ndarray]:
    """Give client k the fraction ``shares[c, k]`` of each shuffled class-c pool."""
    rng = np.random.default_rng(seed)
    num_classes, num_clients = shares.shape
    per_client: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        pool_c = rng.permutation(np.flatnonzero(labels == c))
        bounds = np.round(np.cumsum(np.concatenate([[0.0], shares[c]])) * len(pool_c)).astype(int)
        for k in range(num_clients):
            per_client[k].append(pool_c[bounds[k] : bounds[k + 1]])
    return [np.sort(np.concatenate(parts)).astype(np.int64) for parts in per_client]


def dirichlet_shares(num_classes: int, num_clients: int, concentration: float, rng) -> np.ndarray:
    """Per class, a Dirichlet(concentration) draw over clients: ``(classes, clients)``."""
    return rng.dirichlet(np.full(num_clients, concentration), size=num_classes)


def shard_shares(num_classes: int, num_clients: int, classes_per_client: int, rng) -> np.ndarray:
    """Client k holds ``classes_per_client`` distinct classes; holders split a class evenly.

    Classes are dealt round-robin over a seeded permutation, so every class is
    held by ``num_clients * classes_per_client / num_classes`` clients, give or take one.
    """
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes-per-client must be in [1, {num_classes}], got {classes_per_client}")
    order = rng.permutation(num_classes)
    held = np.zeros((num_classes, num_clients))
    for k in range(num_clients):
        for j in range(classes_per_client):
            held[order[(k * classes_per_client + j) % num_classes], k] = 1.0
    holders = held.sum(axis=1, keepdims=True)
    return np.divide(held, holders, out=np.zeros_like(held), where=holders > 0)


def hold_out(index_sets: list[np.ndarray], fraction: float, seed: int) -> list[ClientSplit]:
    """Move a seeded ``fraction`` of each client's training indices (at least one) to test."""
    rng = np.random.default_rng(seed)
    splits = []
    for k, idx in enumerate(index_sets):
        if len(idx) < 2:
            raise NotEnoughDataError(f"client {k} holds {len(idx)} example(s); at least 2 are needed")
        shuffled = rng.permutation(idx)
        n_test = min(len(idx) - 1, max(1, math.ceil(fraction * len(idx))))
        splits.append(ClientSplit(np.sort(shuffled[n_test:]), np.sort(shuffled[:n_test]), True))
    return splits


def pathological_counts(class_sizes: np.ndarray, num_clients: int, classes_per_client: int, rng) -> np.ndarray:
    """PFLlib's pathological rule: ``(clients, classes)`` example counts, ``classes_per_client`` classes a client.

    Classes are dealt in order: class ``c`` goes to the first ``ceil(n / C * k)`` clients
    that still lack classes, which split it unevenly: all but the last draw a count
    uniformly from ``[size / holders / 10, size / holders)`` and the last takes the rest.
    With 20 clients, 10 classes and 2 a client, clients 0-3 hold classes 0 and 1, 4-7
    classes 2 and 3, and so on; the seed moves only the amounts.
    """
    num_classes = len(class_sizes)
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes-per-client must be in [1, {num_classes}], got {classes_per_client}")
    wanted = np.full(num_clients, classes_per_client)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for c, size in enumerate(class_sizes):
        holders = np.flatnonzero(wanted > 0)[: math.ceil(num_clients / num_classes * classes_per_client)]
        if len(holders) == 0:
            continue  # every client has its classes: the rest of the classes go unused, as in PFLlib
        share = size / len(holders)
        low = max(int(share / 10), 1)
        if share <= low:
            raise NotEnoughDataError(f"class {c} has {size} examples for {len(holders)} clients; use fewer clients")
        drawn = rng.integers(low, int(math.ceil(share)), size=len(holders) - 1)
        counts[holders, c] = np.append(drawn, size - drawn.sum())
        wanted[holders] -= 1
    return counts


def practical_index_sets(labels: np.ndarray, num_clients: int, concentration: float, rng) -> list[np.ndarray]:
    """PFLlib's practical rule: per class a Dirichlet(``concentration``) draw over the clients still under N / n.

    A client that already holds more than its even share ``N / n`` gets nothing more;
    the whole draw repeats until every client holds ``PRACTICAL_MIN_EXAMPLES``.
    """
    if concentration <= 0:
        raise ValueError(f"dirichlet-concentration must be > 0, got {concentration}")
    even = len(labels) / num_clients
    for _ in range(DIRICHLET_MAX_DRAWS):
        held: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c in np.unique(labels):
            pool_c = rng.permutation(np.flatnonzero(labels == c))
            drawn = rng.dirichlet(np.full(num_clients, concentration))
            shares = drawn * (sizes < even)
            if shares.sum() <= 0:  # the draw's mass fell on full clients only: PFLlib would divide by zero here
                shares = drawn
            bounds = (np.cumsum(shares / shares.sum()) * len(pool_c)).astype(int)[:-1]
            for k, part in enumerate(np.split(pool_c, bounds)):
                held[k].append(part)
                sizes[k] += len(part)
        if sizes.min() >= PRACTICAL_MIN_EXAMPLES:
            return [np.sort(np.concatenate(parts)).astype(np.int64) for parts in held]
    raise NotEnoughDataError(f"pfllib-practical left a client under {PRACTICAL_MIN_EXAMPLES} examples in "
                             f"{DIRICHLET_MAX_DRAWS} draws ({num_clients} clients, {len(labels)} examples); use fewer "
                             "clients or a larger dirichlet-concentration")  # fmt: skip


def _pooled(source: ArraySource, spec: PartitionSpec) -> list[ClientSplit]:
    """PFLlib's protocol: pool train and test, split the pool with its rule, hold out test-fraction per client."""
    labels = np.concatenate([source.train_y, source.test_y])
    _check_clients(spec.num_clients, len(labels), "examples")
    rng = np.random.default_rng(spec.seed)
    if spec.name == "pfllib-pathological":
        counts = pathological_counts(np.bincount(labels, minlength=source.num_classes), spec.num_clients,
                                     spec.classes_per_client, rng)  # fmt: skip
        index_sets = split_by_counts(labels, counts, spec.seed, "pooled")
    else:
        index_sets = practical_index_sets(labels, spec.num_clients, spec.concentration, rng)
    return [ClientSplit(s.train, s.test, pooled=True) for s in hold_out(index_sets, spec.test_fraction, spec.seed)]


# --------------------------------------------------------------------------- entry


def _check_clients(num_clients: int, available: int, what: str) -> None:
    if num_clients < 1:
        raise ValueError(f"num-partitions must be >= 1, got {num_clients}")
    if num_clients > available:
        raise NotEnoughDataError(f"asked for {num_clients} clients but the data holds {available} {what}")


def _label_skew_shares(source: ArraySource, spec: PartitionSpec) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    c, k = source.num_classes, spec.num_clients
    if spec.name == "iid":
        return np.full((c, k), 1.0 / k)
    if spec.name == "shards":
        return shard_shares(c, k, spec.classes_per_client, rng)
    if spec.concentration <= 0:
        raise ValueError(f"dirichlet-concentration must be > 0, got {spec.concentration}")
    return dirichlet_shares(c, k, spec.concentration, rng)


def _label_skew(source: ArraySource, spec: PartitionSpec) -> list[ClientSplit]:
    _check_clients(spec.num_clients, len(source.train_y), "training examples")
    retries = DIRICHLET_MAX_DRAWS if spec.name == "dirichlet" else 1
    for attempt in range(retries):
        shares = _label_skew_shares(source, PartitionSpec(**{**spec.__dict__, "seed": spec.seed + attempt * 7919}))
        train = split_by_proportions(source.train_y, shares, spec.seed)
        if source.has_test_set:
            test = split_by_proportions(source.test_y, shares, spec.seed + 1)
            splits = [ClientSplit(tr, te) for tr, te in zip(train, test, strict=True)]
            small = min(min(len(s.train), len(s.test)) for s in splits)
        else:
            small = min(len(idx) for idx in train) - 1
            splits = None
        if small >= 1:
            return splits if splits is not None else hold_out(train, spec.test_fraction, spec.seed)
    raise NotEnoughDataError(
        f"partitioner {spec.name!r} left a client without training or test examples "
        f"({spec.num_clients} clients, {len(source.train_y)} training examples); "
        "use fewer clients" + (" or a larger dirichlet-concentration" if spec.name == "dirichlet" else "")
    )


def _paper(source: ArraySource, spec: PartitionSpec) -> list[ClientSplit]:
    if source.num_classes < PAPER_CLASSES:
        raise ValueError(f"perfedavg-paper needs 10 classes, {source.name} has {source.num_classes}")
    counts = paper_counts(spec.num_clients, spec.images_per_class, spec.paper_variant)
    train = split_by_counts(source.train_y, counts, spec.seed, "training")
    if not source.has_test_set:
        return hold_out(train, spec.test_fraction, spec.seed)
    test = split_by_counts(source.test_y, counts, spec.seed, "test")
    return [ClientSplit(tr, te) for tr, te in zip(train, test, strict=True)]


def _natural(source: ArraySource, spec: PartitionSpec) -> list[ClientSplit]:
    if source.train_groups is None:
        raise ValueError(
            f"partitioner 'natural' needs a dataset with users (femnist, synthetic, least-squares); got {source.name!r}"
        )
    _check_clients(spec.num_clients, len(source.train_groups), "users")
    train = list(source.train_groups[: spec.num_clients])
    if source.test_groups is None:
        return hold_out(train, spec.test_fraction, spec.seed)
    return [ClientSplit(tr, te) for tr, te in zip(train, source.test_groups[: spec.num_clients], strict=True)]


def partition(source: ArraySource, spec: PartitionSpec) -> tuple[ClientSplit, ...]:
    """Split ``source`` for ``spec.num_clients`` clients with the rule ``spec.name``.

    Raises
    ------
    ValueError
        For an unknown partitioner or invalid parameters.
    NotEnoughDataError
        When the data cannot give every client what the rule asks for; the message
        says how much is available.

    """
    if spec.name not in PARTITIONERS:
        raise ValueError(f"partitioner {spec.name!r} is not one of {PARTITIONERS}")
    if not 0.0 < spec.test_fraction < 1.0:
        raise ValueError(f"test-fraction must be in (0, 1), got {spec.test_fraction}")
    if spec.name == "perfedavg-paper":
        return tuple(_paper(source, spec))
    if spec.name == "natural":
        return tuple(_natural(source, spec))
    if spec.name in POOLED:
        return tuple(_pooled(source, spec))
    return tuple(_label_skew(source, spec))
