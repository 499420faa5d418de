"""ClientApp: load this node's partition and hand it to the chosen method's client."""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from app.config import ConfigError, parse_settings
from app.registry import METHODS
from clients.models import build_model
from clients.state import ClientState
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
    """Build this node's client: settings, data (cached per process), model, and its state across rounds."""
    settings = parse_settings(context.run_config)
    partition_id, num_partitions = partition_of(context)
    data = load_client_data(settings.data_spec(num_partitions), settings.partition_spec(num_partitions), partition_id)
    model = build_model(settings.training.model, input_shape=tuple(data.train_x.shape[1:]),
                        num_classes=data.num_classes, seed=settings.run.seed)  # fmt: skip
    method = METHODS[settings.run.strategy]
    client = method.client(model=model, data=data, settings=settings, partition_id=partition_id,
                           num_partitions=num_partitions, state=ClientState(context.state, owner=method.contract.name))
    return client.to_client()


app = ClientApp(client_fn=client_fn)
