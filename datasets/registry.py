"""Name -> loader, with per-process caching of loaded arrays and partitions.

A simulation worker serves many clients; each asks for the same source and
partition, so both are computed once per process and reused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from datasets.base import ArraySource, ClientSplit
from datasets.embedded import load_mnist_5k
from datasets.feature_shift import FEATURE_SHIFTS, colour_transform, shift_colours
from datasets.leaf import FEMNIST_CLASSES, load_femnist
from datasets.least_squares import DIMENSION as LEAST_SQUARES_DIMENSION
from datasets.least_squares import make_least_squares
from datasets.local import USER_DATASETS, load_user_data
from datasets.partition import PartitionSpec, partition
from datasets.synthetic import DIMENSION as SYNTHETIC_DIMENSION
from datasets.synthetic import NUM_CLASSES as SYNTHETIC_CLASSES
from datasets.synthetic import make_synthetic
from datasets.torchvision_sources import EMNIST_CLASSES, load_cifar10, load_mnist_family

# "app": the data an outside app's own function hands over (app.client_app.build_client_app(data=...)); stamen
# cannot load it by name, so the loaders below refuse it
APP_DATA = "app"
DATASETS = ("mnist-5k", "mnist", "fashion-mnist", "emnist", "cifar10", "femnist", "synthetic", "least-squares",
            *USER_DATASETS, APP_DATA)  # fmt: skip
GENERATED = ("synthetic", "least-squares")  # one generated user per partition
NATURAL = ("femnist", "synthetic", "least-squares")  # data with its own users (the natural partitioner)
# a user's own data (USER_DATASETS) may come from each deployed node's own data-dir instead
NEEDS_DATA_DIR = ("mnist", "fashion-mnist", "emnist", "cifar10", "femnist")
EMNIST_SPLITS = tuple(EMNIST_CLASSES)


@dataclass(frozen=True)
class DataSpec:
    """Which dataset to load and from where.

    ``num_users`` matters only for the generated datasets (``synthetic``,
    ``least-squares``: one user per client); ``seed`` seeds their generator.
    ``classes`` (names in label order) and ``input_shape`` describe a user's own
    data (``imagefolder``, ``npz``).
    """

    name: str
    data_dir: str = ""
    download: bool = False
    emnist_split: str = "balanced"
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    num_users: int = 0
    seed: int = 0
    classes: tuple[str, ...] = ()
    input_shape: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class ClientData:
    """One client's arrays, ready for a model."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int

    def fingerprint(self) -> str:
        """SHA-256 over the four arrays' dtypes, shapes and bytes: tells two clients' data apart in the records."""
        digest = hashlib.sha256()
        for array in (self.train_x, self.train_y, self.test_x, self.test_y):
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()


def _check_loadable(spec: DataSpec) -> None:
    if spec.name not in DATASETS:
        raise ValueError(f"dataset {spec.name!r} is not one of {DATASETS}")
    if spec.name == APP_DATA:
        raise ValueError(f"dataset {APP_DATA!r} is an app's own data, which only the app's data function gives "
                         "(app.client_app.build_client_app(data=...); docs/own-app.md)")


def dataset_shape(spec: DataSpec) -> tuple[tuple[int, ...], int]:
    """Input shape of one example and number of classes, without loading any data.

    The server needs them to build the initial model; clients check their data
    against them.
    """
    _check_loadable(spec)
    if spec.name == "synthetic":
        return (SYNTHETIC_DIMENSION,), SYNTHETIC_CLASSES
    if spec.name in USER_DATASETS:
        return spec.input_shape, len(spec.classes)
    if spec.name == "least-squares":
        return (LEAST_SQUARES_DIMENSION,), 0  # regression: no classes
    if spec.name == "cifar10":
        return (3, 32, 32), 10
    if spec.name == "femnist":
        return (1, 28, 28), FEMNIST_CLASSES
    if spec.name == "emnist":
        return (1, 28, 28), EMNIST_CLASSES[spec.emnist_split]
    return (1, 28, 28), 10


@lru_cache(maxsize=4)
def load_source(spec: DataSpec) -> ArraySource:
    """Load (once per process) the whole dataset named by ``spec``."""
    _check_loadable(spec)
    if spec.name == "mnist-5k":
        return load_mnist_5k()
    if spec.name == "synthetic":
        return make_synthetic(
            alpha=spec.synthetic_alpha, beta=spec.synthetic_beta, num_users=spec.num_users, seed=spec.seed
        )
    if spec.name == "least-squares":
        return make_least_squares(
            alpha=spec.synthetic_alpha, beta=spec.synthetic_beta, num_users=spec.num_users, seed=spec.seed
        )
    if not spec.data_dir:
        raise ValueError(f"dataset {spec.name!r} needs data-dir (a folder holding its files)")
    folder = Path(spec.data_dir).expanduser().resolve()
    if spec.name == "femnist":
        return load_femnist(folder)
    if spec.name in USER_DATASETS:
        return load_user_data(spec.name, folder, spec.classes, spec.input_shape)
    if spec.name == "cifar10":
        return load_cifar10(folder, download=spec.download)
    return load_mnist_family(spec.name, folder, download=spec.download, emnist_split=spec.emnist_split)


@lru_cache(maxsize=4)
def load_partition(data: DataSpec, split: PartitionSpec) -> tuple[ClientSplit, ...]:
    """Partition (once per process) the source for every client."""
    return partition(load_source(data), split)


def load_node_data(data: DataSpec, data_dir: str) -> ClientData:
    """A deployed device's own data: all of ``data_dir`` (its ``train`` and ``test``), in ``data``'s format."""
    if data.name not in USER_DATASETS:
        raise ValueError(f"a node's own data-dir needs run config dataset one of {list(USER_DATASETS)} (which names "
                         f"the classes and input shape); dataset is {data.name!r}")  # fmt: skip
    source = load_user_data(data.name, Path(data_dir), data.classes, data.input_shape)
    return ClientData(train_x=source.train_x, train_y=source.train_y, test_x=source.test_x, test_y=source.test_y,
                      num_classes=source.num_classes)  # fmt: skip


def load_client_data(data: DataSpec, split: PartitionSpec, partition_id: int) -> ClientData:
    """The arrays of client ``partition_id`` under the given data and partition specs."""
    if not 0 <= partition_id < split.num_clients:
        raise ValueError(f"partition-id {partition_id} is outside [0, {split.num_clients})")
    source = load_source(data)
    mine = load_partition(data, split)[partition_id]
    if mine.pooled:
        (train_x, train_y), (test_x, test_y) = (pooled_take(source, mine.train), pooled_take(source, mine.test))
    else:
        train_x, train_y = source.train_x[mine.train], source.train_y[mine.train]
        tests = (source.train_x, source.train_y) if mine.test_from_train else (source.test_x, source.test_y)
        test_x, test_y = tests[0][mine.test], tests[1][mine.test]
    if split.feature_shift == "colour":
        transform = colour_transform(split.seed, partition_id)
        train_x, test_x = shift_colours(train_x, transform), shift_colours(test_x, transform)
    elif split.feature_shift != "none":
        raise ValueError(f"feature-shift {split.feature_shift!r} is not one of {FEATURE_SHIFTS}")
    return ClientData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y, num_classes=source.num_classes)


def pooled_take(source: ArraySource, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Examples ``indices`` of the source's training and test sets end to end, without concatenating them."""
    indices = np.asarray(indices, dtype=np.int64)
    n_train = len(source.train_y)
    in_train = indices < n_train
    x = np.empty((len(indices), *source.train_x.shape[1:]), dtype=source.train_x.dtype)
    y = np.empty(len(indices), dtype=source.train_y.dtype)
    x[in_train], y[in_train] = source.train_x[indices[in_train]], source.train_y[indices[in_train]]
    test = indices[~in_train] - n_train
    x[~in_train], y[~in_train] = source.test_x[test], source.test_y[test]
    return x, y
