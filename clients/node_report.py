"""A client's answer to the preflight: its partition, data and code, and whether the round's config suits its data.

A config the client cannot serve is reported as data (``preflight-error``), not raised:
Flower would print a traceback per client (``clients/unavailable.py``); the server's
preflight condenses the answers into one line per cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clients.runtime import ray_node
from clients.unavailable import UnavailableClient
from datasets import LocalDataError, class_counts
from strategies.contracts.client_reports import (
    DATA_DIR,
    DATA_FINGERPRINT,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PARTITION_ID,
    RAY_NODE,
    TEST_CLASSES,
    TRAIN_CLASSES,
)
from strategies.contracts.code import code_identity

if TYPE_CHECKING:
    from clients.base import TorchClient


def node_properties(client: TorchClient, config: dict) -> dict:
    """Partition and sizes; with a fit config, also whether it suits ``client``'s data (else why not)."""
    properties = {PARTITION_ID: client.partition_id, NUM_PARTITIONS: client.num_partitions, DATA_DIR: client.data_dir,
                  NUM_TRAIN: len(client.train_y), NUM_TEST: len(client.test_y), RAY_NODE: ray_node(),
                  **code_identity()}  # fmt: skip
    try:
        properties.update(data_summary(client))
    except Exception as err:  # arrays their loader let through (an app's own, say): one line, not a traceback
        where = client.data_dir or f"partition {client.partition_id}"
        error = LocalDataError(f"the data of {where} cannot be summarised ({type(err).__name__}: {err})")
        return {**properties, **unavailable(client, error, config)}
    try:
        client.check(*client.settings_for(config))
    except ValueError as err:
        properties.update(unavailable(client, err, config))
    return properties


def unavailable(client: TorchClient, error: Exception, config: dict) -> dict:
    """The properties saying why ``client`` cannot serve: ``error``, and whose fault it is.

    A device's own data is its own fault (the run goes on without it); a partition's is the run's config.
    """
    report = UnavailableClient(error=error, partition_id=client.partition_id, num_partitions=client.num_partitions,
                               data_dir=client.data_dir, scope="node" if client.data_dir else "run")  # fmt: skip
    return report.get_properties(config)


def data_summary(client: TorchClient) -> dict[str, str]:
    """The data's fingerprint and, for a classifier, the examples of each class (``"0:40 3:12"``) per split."""
    summary = {DATA_FINGERPRINT: client.data.fingerprint()}
    if not client.train_y.is_floating_point():  # classifiers: which classes this client holds
        for name, labels in ((TRAIN_CLASSES, client.train_y), (TEST_CLASSES, client.test_y)):
            counts = class_counts(labels.cpu().numpy(), 0)
            summary[name] = " ".join(f"{c}:{n}" for c, n in counts.items())
    return summary
