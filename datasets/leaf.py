"""FEMNIST from LEAF's JSON output: a natural split by writer.

LEAF writes ``train/*.json`` and ``test/*.json``; each file maps writers to their
samples: ``{"users": [...], "num_samples": [...], "user_data": {writer: {"x":
[[784 floats]], "y": [labels]}}}``. Every writer's own train and test samples
become that user's split, so the partition is the data's own (``natural``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from datasets.base import ArraySource, DataUnavailableError
from datasets.cache import cache_dir, fingerprint, load_arrays, store_arrays

FEMNIST_CLASSES = 62
CACHE_VERSION = 1


def _fingerprint(data_dir: Path) -> str:
    """Names, sizes and modification times of the JSON files: a changed file means a new cache entry."""
    files = sorted((data_dir / "train").glob("*.json")) + sorted((data_dir / "test").glob("*.json"))
    return fingerprint(data_dir, files, CACHE_VERSION)


def _read_leaf_dir(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataUnavailableError(
            f"no LEAF JSON files in {folder}; expected {folder}/*.json as written by "
            "LEAF's preprocess.sh (train/ and test/ folders side by side)"
        )
    per_writer: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in files:
        try:
            with path.open() as handle:
                blob = json.load(handle)
            writers = [(writer, blob["user_data"][writer]) for writer in blob["users"]]
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataUnavailableError(f"LEAF file {path} is not valid JSON ({err}); is it truncated? "
                                       "Regenerate it or remove it from data-dir") from err  # fmt: skip
        except (KeyError, TypeError) as err:
            raise DataUnavailableError(f"LEAF file {path} lacks 'users' or 'user_data' entry {err}; "
                                       "expected LEAF's format") from err  # fmt: skip
        for writer, entry in writers:
            x = np.asarray(entry["x"], dtype=np.float32)
            y = np.asarray(entry["y"], dtype=np.int64)
            if writer in per_writer:  # a writer split across files: append
                old_x, old_y = per_writer[writer]
                x, y = np.concatenate([old_x, x]), np.concatenate([old_y, y])
            per_writer[writer] = (x, y)
    return per_writer


def _stack(
    per_writer: dict[str, tuple[np.ndarray, np.ndarray]], writers: list[str]
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    xs, ys, groups, start = [], [], [], 0
    for writer in writers:
        x, y = per_writer[writer]
        xs.append(x)
        ys.append(y)
        groups.append(np.arange(start, start + len(y)))
        start += len(y)
    return np.concatenate(xs), np.concatenate(ys), tuple(groups)


def load_femnist(data_dir: Path) -> ArraySource:
    """Load every writer present in both ``train/`` and ``test/`` of ``data_dir``.

    Images are returned as float32 ``(N, 1, 28, 28)`` in LEAF's own scale (0..1,
    white background); writers are ordered by id so the user order is stable.
    Parsing LEAF's JSON takes seconds in every process that needs it (each
    simulation worker), so the arrays are kept as ``.npz`` under :func:`cache_dir`,
    keyed by the files' names, sizes and times; an unwritable cache is skipped.
    """
    cached = cache_dir() / f"femnist-{_fingerprint(data_dir)}.npz" if (data_dir / "train").is_dir() else None
    stored = load_arrays(cached) if cached is not None else None
    if stored is not None:
        groups = {k: tuple(np.split(np.arange(len(stored[f"{k}_y"])), stored[f"{k}_bounds"]))
                  for k in ("train", "test")}  # fmt: skip
        return ArraySource(name="femnist", train_x=stored["train_x"], train_y=stored["train_y"],
                           test_x=stored["test_x"], test_y=stored["test_y"], num_classes=FEMNIST_CLASSES,
                           train_groups=groups["train"], test_groups=groups["test"])  # fmt: skip
    source = _parse_femnist(data_dir)
    if cached is not None:
        bounds = {f"{k}_bounds": np.cumsum([len(g) for g in groups])[:-1]
                  for k, groups in (("train", source.train_groups), ("test", source.test_groups))}  # fmt: skip
        store_arrays(cached, {"train_x": source.train_x, "train_y": source.train_y, "test_x": source.test_x,
                              "test_y": source.test_y, **bounds})  # fmt: skip
    return source


def _parse_femnist(data_dir: Path) -> ArraySource:
    train = _read_leaf_dir(data_dir / "train")
    test = _read_leaf_dir(data_dir / "test")
    writers = sorted(set(train) & set(test))
    if not writers:
        raise DataUnavailableError(f"no writer of {data_dir} has both train and test data")
    train_x, train_y, train_groups = _stack(train, writers)
    test_x, test_y, test_groups = _stack(test, writers)
    for name, x in (("train", train_x), ("test", test_x)):
        if x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(f"FEMNIST {name} inputs must have 784 values, got {x.shape[1:]}")
    return ArraySource(
        name="femnist",
        train_x=train_x.reshape(-1, 1, 28, 28),
        train_y=train_y,
        test_x=test_x.reshape(-1, 1, 28, 28),
        test_y=test_y,
        num_classes=FEMNIST_CLASSES,
        train_groups=train_groups,
        test_groups=test_groups,
    )
