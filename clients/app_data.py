"""A client's data as an app hands it over (tensors, a DataLoader, a dataset) -> :class:`ClientData`.

stamen's clients hold their data as arrays and draw their own seeded batches, so the
data an outside app gives is read once, whole, into memory. What is accepted, for the
training and the test part each:

- a pair ``(x, y)`` of tensors or NumPy arrays;
- a ``torch.utils.data.DataLoader``, whose batches are ``(x, y)`` pairs or dicts;
- anything a ``DataLoader`` can read (a torch ``Dataset``, a flwr-datasets partition
  with a transform that turns its images into tensors).

A dict batch names its label by one of :data:`LABEL_KEYS`; its input is the one other
key that holds a tensor (or say which with ``keys=``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader

from datasets import ClientData

LABEL_KEYS = ("label", "labels", "y", "target", "targets", "fine_label", "character")
READ_BATCH = 512  # a dataset (not a loader) is read in batches of this many examples


class AppDataError(ValueError):
    """The app's data cannot be read as inputs and labels; the message says what was found."""


def _split_batch(batch: object, keys: tuple[str, str] | None) -> tuple[object, object]:
    if isinstance(batch, Mapping):
        if keys is not None:
            missing = [k for k in keys if k not in batch]
            if missing:
                raise AppDataError(f"a batch has no key(s) {missing}; its keys are {sorted(batch)}")
            return batch[keys[0]], batch[keys[1]]
        labels = [k for k in LABEL_KEYS if k in batch]
        inputs = [k for k in batch if k not in labels]
        if len(inputs) > 1:  # other columns (ids, file paths) are not the inputs unless they are tensors
            inputs = [k for k in inputs if isinstance(batch[k], (torch.Tensor, np.ndarray))]
        if len(labels) != 1 or len(inputs) != 1:
            raise AppDataError(f"cannot tell the inputs from the labels in a batch with keys {sorted(batch)}: name "
                               f"them with keys=(input key, label key); a label key is one of {list(LABEL_KEYS)}")
        return batch[inputs[0]], batch[labels[0]]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise AppDataError(f"a batch is a {type(batch).__name__}; give (inputs, labels) pairs or dicts")


def _as_array(value: object, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise AppDataError(f"the {what} are a {type(value).__name__}, not tensors: give the dataset a transform that "
                       "turns each example into tensors (for a flwr-datasets partition: .with_transform(...))")


def read_part(
    part: object, *, keys: tuple[str, str] | None = None, what: str = "data"
) -> tuple[np.ndarray, np.ndarray]:
    """``part`` (see the module's list) as ``(inputs float32, labels int64)`` arrays.

    Raises
    ------
    AppDataError
        If ``part`` is none of the accepted forms, or its batches hold no tensors.

    """
    if isinstance(part, tuple) and len(part) == 2 and not isinstance(part[0], Mapping):
        x, y = _as_array(part[0], f"{what} inputs"), _as_array(part[1], f"{what} labels")
    else:
        if isinstance(part, DataLoader):
            batches: Iterable[object] = part
        elif hasattr(part, "__len__") and hasattr(part, "__getitem__"):
            batches = DataLoader(part, batch_size=READ_BATCH, shuffle=False)
        else:
            raise AppDataError(f"the {what} is a {type(part).__name__}; give (x, y) tensors, a DataLoader or a "
                               "dataset")  # fmt: skip
        xs, ys = [], []
        for batch in batches:
            x_part, y_part = _split_batch(batch, keys)
            xs.append(_as_array(x_part, f"{what} inputs"))
            ys.append(_as_array(y_part, f"{what} labels"))
        if not xs:
            raise AppDataError(f"the {what} is empty")
        x, y = np.concatenate(xs), np.concatenate(ys)
    if len(x) != len(y):
        raise AppDataError(f"the {what} has {len(x)} inputs but {len(y)} labels")
    if not np.issubdtype(y.dtype, np.integer):
        raise AppDataError(f"the {what} labels are {y.dtype}; class indices (integers) are needed")
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


ClientArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A client's (train_x, train_y, test_x, test_y)."""


def read_client_parts(train: object, test: object, *, keys: tuple[str, str] | None = None) -> ClientArrays:
    """The app's training and test parts (see :func:`read_part`) as arrays.

    Raises
    ------
    AppDataError
        If a part cannot be read, or the two parts' inputs differ in shape.

    """
    train_x, train_y = read_part(train, keys=keys, what="training data")
    test_x, test_y = read_part(test, keys=keys, what="test data")
    if train_x.shape[1:] != test_x.shape[1:]:
        raise AppDataError(f"training inputs are {train_x.shape[1:]} but test inputs {test_x.shape[1:]}")
    return train_x, train_y, test_x, test_y


def client_data_from(arrays: ClientArrays, *, num_classes: int) -> ClientData:
    """:class:`ClientData` of a client's arrays, for a model with ``num_classes`` outputs.

    Raises
    ------
    AppDataError
        If a label is outside ``0 .. num_classes - 1``.

    """
    train_x, train_y, test_x, test_y = arrays
    for what, labels in (("training", train_y), ("test", test_y)):
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise AppDataError(f"a {what} label is outside 0..{num_classes - 1} (the model has {num_classes} "
                               f"outputs): labels range {labels.min()}..{labels.max()}")  # fmt: skip
    return ClientData(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y, num_classes=num_classes)
