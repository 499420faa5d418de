"""ClientApp: load this node's partition and hand it to the chosen method's client."""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from app.config import ConfigError, parse_settings
from app.registry import METHODS, STRATEGY_NAMES
from clients import build_model
from datasets import load_client_data


def partition_of(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config, with a clear error if absent."""
    try:
        partition_id = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as err:
        raise ConfigError(
            f"node config lacks {err}; start each SuperNode with "
            '--node-config "partition-id=<i> num-partitions=<n>" (the simulation engine sets both)'
        ) from err
    return partition_id, num_partitions


def client_fn(context: Context) -> Client:
    """Build this node's client: settings, data (cached per process), model."""
    settings = parse_settings(context.run_config, STRATEGY_NAMES)
    partition_id, num_partitions = partition_of(context)
    data = load_client_data(settings.data_spec(num_partitions), settings.partition_spec(num_partitions), partition_id)
    model = build_model(
        settings.model, input_shape=tuple(data.train_x.shape[1:]), num_classes=data.num_classes, seed=settings.seed
    )
    client_class = METHODS[settings.strategy].client_class
    client = client_class(
        model=model,
        data=data,
        settings=settings.client_settings(),
        partition_id=partition_id,
        num_partitions=num_partitions,
    )
    return client.to_client()


app = ClientApp(client_fn=client_fn)
