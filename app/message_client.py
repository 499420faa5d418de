"""The Message API ClientApp: ``train``, ``evaluate`` and ``query`` handlers over stamen's clients.

:func:`build_message_client_app` is the entry point, with the arguments of
:func:`app.client_app.build_client_app`. Each handler builds the node's client as the
legacy ClientApp does (:func:`app.client_app.node_client`: its data, model and state
across rounds in the node's ``Context``), reads the message's records
(:mod:`strategies.message_codec`) and answers in records: a ``train`` reply carries the
array sets the client returns (the model under ``"arrays"``, by the names it was sent),
its numbers in ``"metrics"`` and its text in ``"reports"``; a ``query`` is the
preflight, answered with the node's properties.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray, ndarray_to_bytes

from app import message_cost
from app.client_app import AppData, caller_file, node_client
from app.own_parts import DataFn, ModelFn, OwnParts
from app.workdir import fab_root_of, serve_workers_from_the_fab
from strategies.contracts.models import ModelCard
from strategies.grid_transport import PROPERTIES
from strategies.message_codec import CONFIG_RECORD, read_instruction, reply

Handler = Callable[[Message, Context], Message]


def build_message_client_app(
    *,
    model: ModelFn | None = None,
    model_name: str = "",
    model_card: ModelCard | None = None,
    data: DataFn | None = None,
    data_keys: tuple[str, str] | None = None,
    allow_app_keys: bool = True,
    cached_partitions: int = 16,
) -> ClientApp:
    """A Flower Message API ``ClientApp`` serving the stamen method named by the run config's ``strategy``.

    The arguments are those of :func:`app.client_app.build_client_app` (the app's
    network and data, as given to the server's strategy). Its ``train``, ``evaluate``
    and ``query`` handlers answer a stamen Message API strategy (``stamen.PerFedAvg``
    and the others, :mod:`app.message_methods`).
    """
    serve_workers_from_the_fab(fab_root_of(caller_file()))  # before Flower starts Ray: its workers import this run
    parts = OwnParts(model=model, model_name=model_name, model_card=model_card, allow_app_keys=allow_app_keys)
    load_app_data = None if data is None else AppData(data=data, keys=data_keys, size=cached_partitions)
    app = ClientApp(mods=message_cost.mods())
    build = lambda context: node_client(context, parts, load_app_data)  # noqa: E731
    app.train()(handler(build, train))
    app.evaluate()(handler(build, evaluate))
    app.query()(handler(build, query))
    return app


def handler(build: Callable[[Context], NumPyClient], answer: Callable[[NumPyClient, Message], RecordDict]) -> Handler:
    """A Message API handler: the node's client built from its ``Context``, then ``answer``'s records as the reply."""

    def handle(message: Message, context: Context) -> Message:
        return Message(content=answer(build(context), message), reply_to=message)

    handle.__name__ = answer.__name__
    return handle


def train(client: NumPyClient, message: Message) -> RecordDict:
    """``fit`` on the message's arrays and config; the returned sets named as the model was sent."""
    tensors, config, names = read_instruction(message.content)
    arrays, num_examples, metrics = client.fit([bytes_to_ndarray(t) for t in tensors], config)
    return reply([ndarray_to_bytes(a) for a in arrays], num_examples, metrics, names=names)


def evaluate(client: NumPyClient, message: Message) -> RecordDict:
    """``evaluate`` on the message's arrays and config; the loss, example count and metrics."""
    tensors, config, _ = read_instruction(message.content)
    loss, num_examples, metrics = client.evaluate([bytes_to_ndarray(t) for t in tensors], config)
    return reply([], num_examples, metrics, loss=loss)


def query(client: NumPyClient, message: Message) -> RecordDict:
    """The preflight: the node's properties for the config sent (``get_properties``)."""
    records = message.content.config_records
    config = dict(records[CONFIG_RECORD]) if CONFIG_RECORD in records else {}
    return RecordDict({PROPERTIES: ConfigRecord(client.get_properties(config))})


app = build_message_client_app(allow_app_keys=False)
