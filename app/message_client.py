"""The ClientApp: ``train``, ``evaluate`` and ``query`` handlers over stamen's ``NumPyClient``s.

Each handler builds the node's client (``build``: its data, model and state across rounds
in the node's ``Context``), reads the message's records (:mod:`strategies.flower.codec`)
and answers in records: a ``train`` reply carries the array sets the client returns (the
model under ``"arrays"``, by the names it was sent), its numbers in ``"metrics"`` and its
text in ``"reports"``; a ``query`` is the preflight, answered with the node's properties.
:func:`serving` makes such a ClientApp from any function that builds a stamen client
(:func:`app.client_app.build_client_app` uses stamen's own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from strategies.contracts.payload import from_bytes, to_bytes
from strategies.flower.codec import CONFIG_RECORD, read_instruction, reply
from strategies.flower.fleet import PROPERTIES

SLOWDOWN_KEY = "emulated-slowdown"
Handler = Callable[[Message, Context], Message]
BuildClient = Callable[[Context], NumPyClient]


def serving(build: BuildClient, mods: list[Mod] | None = None) -> ClientApp:
    """A ClientApp whose handlers answer with the stamen client ``build`` makes for the node of each message.

    ``build`` takes the node's ``Context`` and returns a stamen ``NumPyClient``
    (``app.client_app.client_fn``, or an app's wrapper of it).
    """
    app = ClientApp(mods=list(mods or []))
    app.train()(handler(build, train))
    app.evaluate()(handler(build, evaluate))
    app.query()(handler(build, query))
    return app


def handler(build: BuildClient, answer: Callable[[NumPyClient, Message], RecordDict]) -> Handler:
    """A Message API handler: the node's client built from its ``Context``, then ``answer``'s records as the reply."""

    def handle(message: Message, context: Context) -> Message:
        started = time.perf_counter()
        content = answer(build(context), message)
        if answer is train and (factor := slowdown(context.node_config)) > 1:  # an emulated slower device
            time.sleep((factor - 1) * (time.perf_counter() - started))
        return Message(content=content, reply_to=message)

    handle.__name__ = answer.__name__
    return handle


def slowdown(node_config: Mapping[str, object]) -> float:
    """The node's ``emulated-slowdown`` (``--node-config "emulated-slowdown=5"``; default 1: none).

    An emulation for tests and benchmarks of unequal fleets (docs/fleets.md): a node with
    factor f answers each train message after f times the seconds its work took, by sleeping.

    Raises
    ------
    ValueError
        Naming the key, for a value that is not a number from 1 to 1000.

    """
    value = node_config.get(SLOWDOWN_KEY, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 1000:
        raise ValueError(f"node config key {SLOWDOWN_KEY!r}: {value!r} must be a number from 1 to 1000")
    return float(value)


def train(client: NumPyClient, message: Message) -> RecordDict:
    """``fit`` on the message's arrays and config; the returned sets named as the model was sent."""
    tensors, config, names = read_instruction(message.content)
    arrays, num_examples, metrics = client.fit([from_bytes(t) for t in tensors], config)
    return reply([to_bytes(a) for a in arrays], num_examples, metrics, names=names)


def evaluate(client: NumPyClient, message: Message) -> RecordDict:
    """``evaluate`` on the message's arrays and config; the loss, example count and metrics."""
    tensors, config, _ = read_instruction(message.content)
    loss, num_examples, metrics = client.evaluate([from_bytes(t) for t in tensors], config)
    return reply([], num_examples, metrics, loss=loss)


def query(client: NumPyClient, message: Message) -> RecordDict:
    """The preflight: the node's properties for the config sent (``get_properties``)."""
    records = message.content.config_records
    config = dict(records[CONFIG_RECORD]) if CONFIG_RECORD in records else {}
    return RecordDict({PROPERTIES: ConfigRecord(client.get_properties(config))})
