"""The ClientApp on Flower's Message API: ``train``, ``evaluate`` and ``query`` handlers over stamen's clients.

Each handler builds the node's client as the legacy ClientApp does (``build``: its
data, model and state across rounds in the node's ``Context``), reads the message's
records (:mod:`strategies.message_codec`) and answers in records: a ``train`` reply
carries the array sets the client returns (the model under ``"arrays"``, by the names
it was sent), its numbers in ``"metrics"`` and its text in ``"reports"``; a ``query``
is the preflight, answered with the node's properties.

:class:`BothApis` is the ClientApp :func:`app.client_app.build_client_app` returns: it
answers a legacy server (``api = "legacy"``) and a Message API one alike, by the
message it receives, so a node serves either without knowing the run's choice.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from flwr.common import MessageTypeLegacy, bytes_to_ndarray, ndarray_to_bytes

from strategies.grid_transport import PROPERTIES
from strategies.message_codec import CONFIG_RECORD, read_instruction, reply

Handler = Callable[[Message, Context], Message]
BuildClient = Callable[[Context], NumPyClient]
LEGACY_TYPES = (MessageTypeLegacy.GET_PROPERTIES, MessageTypeLegacy.GET_PARAMETERS)
LEGACY_RECORDS = ("fitins.", "evaluateins.")  # flwr.compat's record names for a legacy instruction


def serving_both(client_fn: Callable[[Context], Client], mods: list[Mod] | None = None) -> BothApis:
    """A ClientApp answering both of Flower's APIs with the client ``client_fn`` builds for each message.

    ``client_fn`` is a legacy ``client_fn`` returning a Flower ``Client`` over a stamen
    ``NumPyClient`` (``app.client_app.client_fn``, or an app's wrapper of it); the
    Message API handlers use the same ``NumPyClient``.
    """
    mods = list(mods or [])
    return BothApis(legacy=ClientApp(client_fn=client_fn, mods=mods),
                    message=message_client_app(lambda context: client_fn(context).numpy_client, mods))  # fmt: skip


def message_client_app(build: BuildClient, mods: list[Mod]) -> ClientApp:
    """A Message API ClientApp whose handlers answer with the client ``build`` makes for the node."""
    app = ClientApp(mods=mods)
    app.train()(handler(build, train))
    app.evaluate()(handler(build, evaluate))
    app.query()(handler(build, query))
    return app


def handler(build: BuildClient, answer: Callable[[NumPyClient, Message], RecordDict]) -> Handler:
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


def is_legacy(message: Message) -> bool:
    """Whether ``message`` comes from Flower's legacy server (its types and record names), not the Message API."""
    if message.metadata.message_type in LEGACY_TYPES:
        return True
    return message.has_content() and any(key.startswith(LEGACY_RECORDS) for key in message.content.keys())


class BothApis(ClientApp):
    """A ClientApp answering each message on the API it came in: ``legacy`` or ``message``.

    Parameters
    ----------
    legacy
        The ``client_fn`` ClientApp (Flower's legacy API).
    message
        The Message API ClientApp over the same clients (:func:`message_client_app`).

    """

    def __init__(self, *, legacy: ClientApp, message: ClientApp) -> None:
        super().__init__()
        self.legacy = legacy
        self.message = message

    def __call__(self, message: Message, context: Context) -> Message:
        return (self.legacy if is_legacy(message) else self.message)(message, context)
