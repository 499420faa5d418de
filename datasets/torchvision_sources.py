"""MNIST, Fashion-MNIST, EMNIST and CIFAR-10 in torchvision's own folder layout.

The MNIST family is read from ``<data-dir>/<Folder>/raw/`` as idx files, either
extracted (what torchvision's download leaves) or still gzipped (``*.gz``), so a
read-only copy holding only the ``.gz`` files works too. CIFAR-10 is read by
torchvision from ``<data-dir>/cifar-10-batches-py/``. Nothing is downloaded unless
``download`` is true; offline, a missing file raises ``DataUnavailableError``
naming the files expected and where.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from datasets.base import ArraySource, DataUnavailableError

EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}
_MNIST_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Read one idx file (plain or gzipped) into an array of its stored shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        blob = handle.read()
    if len(blob) < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file")
    ndim = blob[3]
    dims = tuple(int.from_bytes(blob[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(blob, dtype=_IDX_DTYPES[blob[2]], offset=4 + 4 * ndim)
    return data.reshape(dims)


def _idx_names(dataset: str, emnist_split: str) -> dict[str, tuple[str, str]]:
    if dataset != "emnist":
        return _MNIST_NAMES
    return {
        part: (f"emnist-{emnist_split}-{part}-images-idx3-ubyte", f"emnist-{emnist_split}-{part}-labels-idx1-ubyte")
        for part in ("train", "test")
    }


def _find(raw: Path, name: str) -> Path | None:
    for candidate in (raw / name, raw / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _download(dataset: str, data_dir: Path, emnist_split: str) -> None:
    import torchvision.datasets as tvd  # imported only when asked to download

    cls = {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "emnist": tvd.EMNIST}[dataset]
    extra = {"split": emnist_split} if dataset == "emnist" else {}
    for train in (True, False):
        cls(root=str(data_dir), train=train, download=True, **extra)


def load_mnist_family(dataset: str, data_dir: Path, *, download: bool, emnist_split: str = "balanced") -> ArraySource:
    """Load ``mnist``, ``fashion-mnist`` or ``emnist`` as uint8 ``(N, 1, 28, 28)`` images."""
    folder = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "emnist": "EMNIST"}[dataset]
    raw = data_dir / folder / "raw"
    names = _idx_names(dataset, emnist_split)
    wanted = [n for pair in names.values() for n in pair]
    if download and any(_find(raw, n) is None for n in wanted):
        _download(dataset, data_dir, emnist_split)
    missing = [n for n in wanted if _find(raw, n) is None]
    if missing:
        raise DataUnavailableError(
            f"{dataset}: missing {', '.join(missing)} (plain or .gz) in {raw}; torchvision's layout is "
            f"<data-dir>/{folder}/raw/<file>. Point data-dir at a folder holding them, or set download = true "
            "on a machine with internet access"
        )
    arrays = {}
    for part, (images_name, labels_name) in names.items():
        images = read_idx(_find(raw, images_name))
        labels = read_idx(_find(raw, labels_name)).astype(np.int64)
        if len(images) != len(labels):
            raise ValueError(f"{dataset} {part}: {len(images)} images but {len(labels)} labels")
        arrays[part] = (images[:, None, :, :].astype(np.uint8), labels)
    num_classes = EMNIST_CLASSES[emnist_split] if dataset == "emnist" else 10
    return ArraySource(dataset, *arrays["train"], *arrays["test"], num_classes=num_classes)


def load_cifar10(data_dir: Path, *, download: bool) -> ArraySource:
    """Load CIFAR-10 via torchvision as uint8 ``(N, 3, 32, 32)`` images."""
    import torchvision.datasets as tvd

    try:
        parts = [tvd.CIFAR10(root=str(data_dir), train=t, download=download) for t in (True, False)]
    except RuntimeError as err:
        raise DataUnavailableError(
            f"cifar10: {err}. torchvision's layout is <data-dir>/cifar-10-batches-py/ holding data_batch_1 .. "
            f"data_batch_5, test_batch and batches.meta (looked in {data_dir}); or set download = true"
        ) from err
    (train_x, train_y), (test_x, test_y) = (
        (np.ascontiguousarray(p.data.transpose(0, 3, 1, 2)), np.asarray(p.targets, dtype=np.int64)) for p in parts
    )
    return ArraySource("cifar10", train_x, train_y, test_x, test_y, num_classes=10)
