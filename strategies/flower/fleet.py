"""The nodes behind a Flower grid, as the preflight and each round read them (``strategies.nodes.preflight.Fleet``).

:class:`GridFleet` lists the grid's nodes, waits for them, and asks several at once for
their properties: one ``query`` message each (the ClientApp's query handler answers with
a ``properties`` ConfigRecord), one wait for every reply. :func:`replies_by_node` matches
replies to the messages sent, and :func:`failure_of` turns a node's silence or error
into its failure (``strategies/nodes/failures.py``), for the preflight and the rounds alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from strategies.contracts.payload import Scalar
from strategies.flower.codec import CONFIG_RECORD
from strategies.nodes.failures import NodeFailureError, no_reply, raised_in_client
from strategies.nodes.preflight import Answer

PROPERTIES = "properties"  # the ConfigRecord of a query reply (app/message_client.py)
POLL_S = 1.0  # how often waiting for nodes asks the grid again


def replies_by_node(sent: list[Message], received: Iterable[Message]) -> dict[int, Message]:
    """Each sent message's destination -> the first reply to it.

    A reply answers a message by its id (``reply_to_message_id``, set when Flower sent the
    message): the SuperLink's own reply for a node it lost comes from the SuperLink's node
    id, not the node's. A reply to no sent message is left out.
    """
    asked = {message.metadata.dst_node_id for message in sent}
    by_id = {m.metadata.message_id: m.metadata.dst_node_id for m in sent if m.metadata.message_id}  # ids once sent
    replies: dict[int, Message] = {}
    for reply in received:
        node = by_id.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        if node in asked:
            replies.setdefault(node, reply)
    return replies


def failure_of(reply: Message | None, node: int, waited_s: float) -> NodeFailureError | None:
    """Node ``node``'s failure: no ``reply`` within ``waited_s`` s, or one that carries an error; else ``None``."""
    if reply is None:
        return no_reply(waited_s, str(node))
    if reply.has_error():
        return raised_in_client(reply.error.reason, str(node))
    return None


class GridFleet:
    """The nodes connected to ``grid`` (see the module's docstring).

    Parameters
    ----------
    grid
        The grid the ServerApp was given (or stamen's paced wrapper of it).

    """

    def __init__(self, *, grid: Grid) -> None:
        self.grid = grid

    def node_ids(self) -> list[str]:
        """The ids of the nodes connected now, in the order of their numbers."""
        return [str(node) for node in sorted(self.grid.get_node_ids())]

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` nodes connected within ``timeout`` seconds (asking the grid every second)."""
        deadline = time.monotonic() + timeout
        while len(self.node_ids()) < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def ask(self, cids: list[str], config: dict[str, Scalar], reply_s: float) -> list[Answer]:
        """Every node's properties for ``config``: one push of a ``query`` message each, one wait for all replies.

        A silent node, one whose reply carries an error and one whose reply lacks its
        records each answer with the exception that says so.
        """
        messages = [Message(content=RecordDict({CONFIG_RECORD: ConfigRecord(config)}), dst_node_id=int(cid),
                            message_type=MessageType.QUERY, ttl=reply_s) for cid in cids]  # fmt: skip
        replies = replies_by_node(messages, self.grid.send_and_receive(messages, timeout=reply_s))
        answers: list[Answer] = []
        for cid in cids:
            reply = replies.get(int(cid))
            failure = failure_of(reply, int(cid), reply_s)
            if failure is not None:
                answers.append(failure)
                continue
            try:
                answers.append(dict(reply.content.config_records[PROPERTIES]))
            except (KeyError, TypeError, ValueError) as err:  # a reply without its records is an answer that fails
                answers.append(ValueError(f"unreadable properties reply ({type(err).__name__}: {err})"))
        return answers
