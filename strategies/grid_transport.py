"""The grid transport: nodes asked for their properties over Flower's grid, the one file a Flower upgrade touches.

Two dialects: the legacy ``get_properties`` message (nodes behind ``GridClientProxy``)
and the Message API's ``query`` (:class:`QueryNode`).

Flower's ``GridClientProxy.get_properties`` asks one node and waits for its reply;
:func:`ask_properties` re-implements it on ``flwr.compat`` internals (its record
conversions) to ask every node behind one grid in one push, and reads the replies as
Flower does. The text of a failed reply is Flower's (:data:`CLIENT_ERROR`), and
:func:`client_error`, which reads a ClientApp's exception back out of that text for the
failure groups (``failures.py``), sits beside it: a Flower upgrade that changes one
changes both, here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import Code, GetPropertiesIns, GetPropertiesRes, MessageTypeLegacy, Scalar, Status
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.serverapp import Grid

REPLY_S = 300  # a node that has not answered the preflight by then cannot start (run config key preflight-timeout)
# ... plus this much per node asked beyond REPLY_NODES: a simulation's workers answer the nodes a few at a time, each
# first message loading the node's data, so the preflight of a large federation on a small machine takes longer
REPLY_S_PER_NODE, REPLY_NODES = 2.0, 100
NO_REPLY = "sent no reply within"  # the start of a silent node's failure (a TimeoutError's text)
WORKERS = 8  # nodes asked at a time where they are not behind one grid
# Flower's text for a reply that carries an error (flwr.server.compat.grid_client_proxy.GridClientProxy), whose
# reason is "<class 'X'>:<'message'>" for an exception raised in a ClientApp
CLIENT_ERROR = "Message contains an Error (reason: {reason}). It originated during client-side execution of a message."
CLIENT_RAISED = re.compile(
    r"Message contains an Error \(reason: <class '(?:[\w.]+\.)?(\w+)'>:<'?(.*?)'?>\)\. It originated during "
    r"client-side execution of a message\.",
    re.DOTALL,
)


class NodeFailureError(Exception):
    """A node's failure; ``cid`` names the node (its failure's label, ``ReplyScreen``)."""

    def __init__(self, text: str, *, cid: str) -> None:
        super().__init__(text)
        self.cid = cid


class NodeError(NodeFailureError, ValueError):
    """A node's reply that carries an error or cannot be read."""


class NoReplyError(NodeFailureError, TimeoutError):
    """A message no reply came back for within the phase's timeout."""


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


def client_error(text: str) -> tuple[str, str] | None:
    """The class name and message of a ClientApp's exception in Flower's :data:`CLIENT_ERROR` text, else ``None``."""
    raised = CLIENT_RAISED.search(text)
    return (raised.group(1), raised.group(2)) if raised else None


def reply_seconds(timeout: float, asked: int) -> float:
    """Seconds the server waits for ``asked`` nodes' answers: ``timeout``, else the default scaled to ``asked``.

    The default is ``REPLY_S`` plus ``REPLY_S_PER_NODE`` for each node beyond ``REPLY_NODES``.
    """
    return timeout if timeout > 0 else REPLY_S + REPLY_S_PER_NODE * max(0, asked - REPLY_NODES)


def ask_properties(
    proxies: list[ClientProxy], config: dict[str, Scalar], reply_s: float = REPLY_S
) -> list[dict[str, Scalar] | Exception]:
    """Every proxy's properties, or the exception that came back instead (its reason travels in the message).

    Nodes reached through one Flower grid (every ServerApp's) are asked all at once:
    Flower's proxy waits for its one reply by polling the grid (every 0.1 s in a
    simulation), so asking node by node, even eight at a time, made the preflight of
    1,000 nodes take tens of seconds of waiting.
    """
    grids = {id(p.grid) for p in proxies if isinstance(p, GRID_PROXIES)}
    if proxies and len(grids) == 1 and all(isinstance(p, GRID_PROXIES) for p in proxies):
        return _ask_at_once(proxies, config, reply_s)

    def ask(proxy: ClientProxy) -> dict[str, Scalar] | Exception:
        try:
            return dict(proxy.get_properties(GetPropertiesIns(config=config), timeout=reply_s, group_id=0).properties)
        except Exception as err:
            return err

    if not proxies:
        return []
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(ask, proxies))


class QueryNode(ClientProxy):
    """A node behind a Message API grid: asked its properties with a ``query`` message (the ClientApp's query handler).

    The Message API strategy (``strategies/message_strategy.py``) sends the fit and
    evaluate messages itself; this proxy only answers the preflight and the node
    directory's questions, as :class:`GridClientProxy` does on the legacy path.
    """

    def __init__(self, *, node_id: int, grid: Grid) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id
        self.grid = grid

    def get_properties(self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None) -> GetPropertiesRes:
        answer = _ask_at_once([self], dict(ins.config), timeout or REPLY_S)[0]
        if isinstance(answer, Exception):
            raise answer
        return GetPropertiesRes(Status(Code.OK, ""), answer)

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError("stamen's server never asks a node for its parameters")

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError("the Message API strategy sends train messages itself")

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError("the Message API strategy sends evaluate messages itself")

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


GRID_PROXIES = (GridClientProxy, QueryNode)
PROPERTIES = "properties"  # the ConfigRecord of a query reply (app/message_client.py)


def _question(proxy: GridClientProxy | QueryNode, config: dict[str, Scalar], reply_s: float) -> Message:
    if isinstance(proxy, QueryNode):
        return Message(content=RecordDict({"config": ConfigRecord(config)}), dst_node_id=proxy.node_id,
                       message_type=MessageType.QUERY, ttl=reply_s)  # fmt: skip
    return Message(content=compat.getpropertiesins_to_recorddict(GetPropertiesIns(config=config)),
                   dst_node_id=proxy.node_id, message_type=MessageTypeLegacy.GET_PROPERTIES, ttl=reply_s)  # fmt: skip


def _answer(proxy: GridClientProxy | QueryNode, content: RecordDict) -> dict[str, Scalar]:
    if isinstance(proxy, QueryNode):
        return dict(content.config_records[PROPERTIES])
    return dict(compat.recorddict_to_getpropertiesres(content).properties)


def _ask_at_once(
    proxies: list[GridClientProxy | QueryNode], config: dict[str, Scalar], reply_s: float
) -> list[dict[str, Scalar] | Exception]:
    """The properties of every node behind one grid: one push of a message per node, one wait for all replies.

    On the legacy path the messages and the reading of the replies are those of Flower's
    ``GridClientProxy.get_properties``, and a failed node's exception reads the same; on
    the Message API path the question is a ``query`` message.
    """
    messages = [_question(proxy, config, reply_s) for proxy in proxies]
    replies = replies_by_node(messages, proxies[0].grid.send_and_receive(messages, timeout=reply_s))
    answers: list[dict[str, Scalar] | Exception] = []
    for proxy in proxies:
        reply = replies.get(proxy.node_id)
        if reply is None:
            answers.append(TimeoutError(f"{NO_REPLY} {reply_s:g} s"))  # the same text for every silent node: one cause
        elif reply.has_error():
            answers.append(ValueError(CLIENT_ERROR.format(reason=reply.error.reason)))
        else:
            try:
                answers.append(_answer(proxy, reply.content))
            except (KeyError, TypeError, ValueError) as err:  # a reply without its records is an answer that fails
                answers.append(ValueError(f"unreadable properties reply ({type(err).__name__}: {err})"))
    return answers
