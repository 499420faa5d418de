"""ClientApp: load this node's data (its partition, or its own data-dir) and hand it to the method's client."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from flwr.client import Client, ClientApp
from flwr.common import Context

from app import message_cost
from app.config import ConfigError, parse_settings
from app.registry import METHODS
from app.workdir import serve_workers_from_the_fab
from clients.base import TorchClient
from clients.models import build_model
from clients.state import ClientState
from clients.unavailable import UnavailableClient
from datasets import USER_DATASETS, load_client_data, load_node_data

serve_workers_from_the_fab()  # before Flower starts Ray: its workers then import this run's code


@dataclass(frozen=True)
class NodePlace:
    """Where a node's data comes from: a partition of the run's dataset, or its own ``data-dir``.

    A deployed device with its own data needs no partition id (-1: the server numbers
    it); one may still be given, to fix the device's number across runs.
    """

    partition_id: int
    num_partitions: int
    data_dir: str = ""


def place_of(context: Context) -> NodePlace:
    """The node's :class:`NodePlace` from its node config, with a clear error if it names neither."""
    config = context.node_config
    data_dir = str(config.get("data-dir", ""))
    try:
        if data_dir:
            return NodePlace(int(config.get("partition-id", -1)), int(config.get("num-partitions", 0)), data_dir)
        return NodePlace(int(config["partition-id"]), int(config["num-partitions"]))
    except KeyError as err:
        raise ConfigError(
            f"node config lacks {err}; start each SuperNode with --node-config \"data-dir='/its/own/data'\" "
            '(its own files) or "partition-id=<i> num-partitions=<n>" (a slice of the run\'s dataset; the '
            "simulation engine sets both)"
        ) from err


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
        config = context.node_config
        return UnavailableClient(error=err, partition_id=int(config.get("partition-id", -1)),
                                 num_partitions=int(config.get("num-partitions", 0)),
                                 data_dir=str(config.get("data-dir", ""))).to_client()  # fmt: skip


def build_client(context: Context) -> TorchClient:
    """Build this node's client: settings, data (cached per process), model, and its state across rounds."""
    settings = parse_settings(context.run_config)
    place = place_of(context)
    message_cost.mark("settings")
    reload = None  # a device with its own data holds only that
    if place.data_dir:
        data = load_node_data(settings.data_spec(), place.data_dir)
    elif settings.data.dataset in USER_DATASETS and not settings.data.data_dir:
        raise ConfigError(f"dataset {settings.data.dataset!r} needs a data-dir: run config key 'data-dir' (one "
                          "folder split over the clients) or each node's own --node-config data-dir")  # fmt: skip
    else:
        # a slice of the run's dataset: it can load any partition, the one the server sends after a sampled preflight
        reload = partial(load_client_data, settings.data_spec(place.num_partitions),
                         settings.partition_spec(place.num_partitions))  # fmt: skip
        data = reload(place.partition_id)
    message_cost.mark("data")
    model = build_model(settings.training.model, input_shape=tuple(data.train_x.shape[1:]),
                        num_classes=data.num_classes, seed=settings.run.seed)  # fmt: skip
    method = METHODS[settings.run.strategy]
    client = method.client(model=model, data=data, settings=settings, partition_id=place.partition_id,
                           num_partitions=place.num_partitions, data_dir=place.data_dir,
                           state=ClientState(context.state, owner=method.contract.name),
                           reload=reload)  # fmt: skip
    message_cost.mark("built")
    return client


app = ClientApp(client_fn=client_fn, mods=message_cost.mods())
message_cost.mark("imported")
