"""ClientApp: load this node's partition and hand it to the chosen method's client."""

from __future__ import annotations

from flwr.client import Client, ClientApp
from flwr.common import Context

from app.config import ConfigError, parse_settings
from app.registry import METHODS
from clients.base import TorchClient
from clients.models import build_model
from clients.state import ClientState
from clients.unavailable import UnavailableClient
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
    """The node's client; one that reports the reason instead, when it cannot be built.

    A failure here (a missing GPU, an unreadable data file, a node config without its
    partition) is answered as data (:class:`UnavailableClient`), so the server's
    preflight can condense it into one line per cause instead of Flower printing a
    Ray traceback for every client.
    """
    try:
        return build_client(context).to_client()
    except Exception as err:
        partition = context.node_config.get("partition-id", -1)
        partitions = context.node_config.get("num-partitions", 0)
        return UnavailableClient(error=err, partition_id=int(partition), num_partitions=int(partitions)).to_client()


def build_client(context: Context) -> TorchClient:
    """Build this node's client: settings, data (cached per process), model, and its state across rounds."""
    settings = parse_settings(context.run_config)
    partition_id, num_partitions = partition_of(context)
    data = load_client_data(settings.data_spec(num_partitions), settings.partition_spec(num_partitions), partition_id)
    model = build_model(settings.training.model, input_shape=tuple(data.train_x.shape[1:]),
                        num_classes=data.num_classes, seed=settings.run.seed)  # fmt: skip
    method = METHODS[settings.run.strategy]
    return method.client(model=model, data=data, settings=settings, partition_id=partition_id,
                         num_partitions=num_partitions, state=ClientState(context.state, owner=method.contract.name))


app = ClientApp(client_fn=client_fn)
