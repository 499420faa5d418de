"""ClientApp: load this node's data (its partition, its own data-dir, or the app's) and hand it to the method's client.

:func:`build_client_app` is the entry point, for stamen's own app (``app`` below) and an outside app alike.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context

from app import message_cost
from app.config import ConfigError
from app.message_client import serving
from app.own_parts import DataFn, ModelFn, OwnParts
from app.registry import METHODS
from app.workdir import fab_root_of, serve_workers_from_the_fab
from clients.app_data import ClientArrays, client_data_from, read_client_parts
from clients.base import TorchClient
from clients.models import build_model
from clients.state import ClientState
from clients.unavailable import UnavailableClient
from datasets import USER_DATASETS, ClientData, hold_out_validation, load_client_data, load_node_data
from strategies.contracts.models import ModelCard
from strategies.contracts.settings import Settings


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


def build_client_app(
    *,
    model: ModelFn | None = None,
    model_name: str = "",
    model_card: ModelCard | None = None,
    data: DataFn | None = None,
    data_keys: tuple[str, str] | None = None,
    allow_app_keys: bool = True,
    cached_partitions: int = 16,
) -> ClientApp:
    """A Flower ``ClientApp`` that serves the stamen method named by the run config's ``strategy``.

    It is what stamen's own app runs (``app = build_client_app(allow_app_keys=False)``).
    Its ``train``, ``evaluate`` and ``query`` handlers (:func:`app.message_client.serving`)
    answer a stamen round engine's messages (``stamen.PerFedAvg`` and the others). Give
    ``model`` and ``model_name``/``model_card`` as given to :func:`app.server_app.build_server_app`,
    so that both sides build the same network.

    Parameters
    ----------
    model
        ``model(run_config) -> torch.nn.Module``, the app's network (built from the run's
        ``seed``); ``None``: the registered model named by the ``model`` key.
    model_name, model_card
        As for ``build_server_app``.
    data
        ``data(partition_id, num_partitions, run_config) -> (train, test)``: one client's
        data as ``(x, y)`` tensors, a ``DataLoader`` or a dataset (a flwr-datasets partition
        with a tensor transform), read once into memory (:mod:`clients.app_data`). Its
        labels must be class indices below the model's output size. ``None``: stamen's
        ``dataset`` and ``partitioner`` keys.
    data_keys
        ``(input key, label key)`` of dict batches, when stamen cannot tell them apart.
    allow_app_keys
        As for ``build_server_app``.
    cached_partitions
        How many clients' data one process keeps between messages (a simulation worker
        serves many clients; each would otherwise read its data again every round).

    """
    serve_workers_from_the_fab(fab_root_of(caller_file()))  # before Flower starts Ray: its workers import this run
    parts = OwnParts(model=model, model_name=model_name, model_card=model_card, allow_app_keys=allow_app_keys)
    load_app_data = None if data is None else AppData(data=data, keys=data_keys, size=cached_partitions)
    return serving(client_function(parts, load_app_data), message_cost.mods())


def caller_file() -> Path:
    """The file of the code that called the function calling this one (an app's client module)."""
    return Path(sys._getframe(2).f_code.co_filename)


def client_function(parts: OwnParts, load_app_data: AppData | None = None) -> Callable[[Context], NumPyClient]:
    """The function that builds a node's stamen client for an app's parts (:func:`build_client_app`)."""

    def client_fn(context: Context) -> NumPyClient:
        return node_client(context, parts=parts, load_app_data=load_app_data)

    return client_fn


def node_client(context: Context, *, parts: OwnParts, load_app_data: AppData | None = None) -> NumPyClient:
    """The node's client; one that reports the reason instead, when it cannot be built.

    A failure here (a missing GPU, an unreadable data file, a node config without its
    partition) is answered as data (:class:`UnavailableClient`), so the server's
    preflight can condense it into one line per cause instead of Flower printing a
    Ray traceback for every client.
    """
    try:
        return build_client(context, parts, load_app_data)
    except Exception as err:
        config = context.node_config
        return UnavailableClient(error=err, partition_id=int(config.get("partition-id", -1)),
                                 num_partitions=int(config.get("num-partitions", 0)),
                                 data_dir=str(config.get("data-dir", "")))  # fmt: skip


@dataclass(frozen=True)
class AppData:
    """The app's data function, read into arrays and kept per process for the last ``size`` requests.

    Flower's simulation pickles the ClientApp into its Ray workers for every message, so
    the cache lives in this module (:data:`READ_APP_DATA`), which each worker imports
    once, keyed by the data function's import path and the request.
    """

    data: DataFn
    keys: tuple[str, str] | None
    size: int

    def __call__(self, partition_id: int, num_partitions: int, config: tuple) -> ClientArrays:
        function = f"{self.data.__module__}.{getattr(self.data, '__qualname__', repr(self.data))}"
        request = (function, self.keys, partition_id, num_partitions, config)
        if request in READ_APP_DATA:
            READ_APP_DATA.move_to_end(request)
            return READ_APP_DATA[request]
        train, test = self.data(partition_id, num_partitions, dict(config))
        READ_APP_DATA[request] = arrays = read_client_parts(train, test, keys=self.keys)
        while len(READ_APP_DATA) > self.size:
            READ_APP_DATA.popitem(last=False)
        return arrays


READ_APP_DATA: OrderedDict[tuple, ClientArrays] = OrderedDict()


def output_size(model: torch.nn.Module, example: torch.Tensor) -> int:
    """How many classes ``model`` scores: the size of its output for one ``example``, in eval mode."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        size = int(model(example[None]).shape[-1])
    model.train(was_training)
    return size


def held_out(
    data: ClientData, reload: Callable[[int], ClientData] | None, settings: Settings, partition_id: int
) -> tuple[ClientData, Callable[[int], ClientData] | None]:
    """The client's data, and its loader of other partitions, with the run's validation split held out."""
    hold = partial(hold_out_validation, fraction=settings.data.validation_fraction, seed=settings.run.seed)

    def reload_held_out(other: int) -> ClientData:
        return hold(reload(other), partition_id=other)

    return hold(data, partition_id=partition_id), None if reload is None else reload_held_out


def build_client(
    context: Context, parts: OwnParts | None = None, load_app_data: AppData | None = None
) -> TorchClient:
    """Build this node's client: settings, data (cached per process), model, and its state across rounds."""
    parts = parts if parts is not None else OwnParts(allow_app_keys=False)
    settings, network = parts.settings(context.run_config, own_data=load_app_data is not None)
    place = place_of(context)
    message_cost.mark("settings")
    reload = None  # a device with its own data holds only that
    if load_app_data is not None:
        if network is None:
            raise ConfigError("an app with its own data needs its own model too: build_client_app(model=...) (wrap a "
                              "registered one: lambda config: build_model('fedavg-cnn', ...))")  # fmt: skip
        config = tuple(sorted(context.run_config.items()))
        arrays = load_app_data(place.partition_id, place.num_partitions, config)
        num_classes = output_size(network, torch.as_tensor(arrays[0][0]))

        def reload(partition_id: int) -> ClientData:
            return client_data_from(load_app_data(partition_id, place.num_partitions, config), num_classes=num_classes)

        data = client_data_from(arrays, num_classes=num_classes)
    elif place.data_dir:
        data = load_node_data(settings.data_spec(), place.data_dir)
    elif settings.data.dataset in USER_DATASETS and not settings.data.data_dir:
        raise ConfigError(f"dataset {settings.data.dataset!r} needs a data-dir: run config key 'data-dir' (one "
                          "folder split over the clients) or each node's own --node-config data-dir")  # fmt: skip
    else:
        # a slice of the run's dataset: it can load any partition, the one the server sends after a sampled preflight
        reload = partial(load_client_data, settings.data_spec(place.num_partitions),
                         settings.partition_spec(place.num_partitions))  # fmt: skip
        data = reload(place.partition_id)
    if settings.data.validation_fraction > 0:  # tuning: every evaluation reads the held-out share, never the test
        data, reload = held_out(data, reload, settings, place.partition_id)
    message_cost.mark("data")
    model = network if network is not None else build_model(
        settings.training.model, input_shape=tuple(data.train_x.shape[1:]), num_classes=data.num_classes,
        seed=settings.run.seed)  # fmt: skip
    method = METHODS[settings.run.strategy]
    client = method.client(model=model, data=data, settings=settings, partition_id=place.partition_id,
                           num_partitions=place.num_partitions, data_dir=place.data_dir,
                           state=ClientState(context.state, owner=method.contract.name),
                           reload=reload)  # fmt: skip
    message_cost.mark("built")
    return client


client_fn = client_function(OwnParts(allow_app_keys=False))  # stamen's own (apps that wrap it, the tests)
app = build_client_app(allow_app_keys=False)
message_cost.mark("imported")
