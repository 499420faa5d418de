"""How a node's failure reads: no reply within the wait, or an error its ClientApp raised, in Flower's words.

A node that sends no reply, or a reply that carries an error, fails its message; the
Flower adapter (``strategies/flower/transport.py``) makes each such failure a
:class:`NodeFailureError` naming the node. The text of a ClientApp's exception is
Flower's (:data:`CLIENT_ERROR`, the sentence its legacy proxies wrote and that run logs
and failure groups have always shown); :func:`client_error` reads the exception back out
of it for the failure groups (``failures.py``). Pure Python.
"""

from __future__ import annotations

import re

REPLY_S = 300  # a node that has not answered the preflight by then cannot start (run config key preflight-timeout)
# ... plus this much per node asked beyond REPLY_NODES: a simulation's workers answer the nodes a few at a time, each
# first message loading the node's data, so the preflight of a large federation on a small machine takes longer
REPLY_S_PER_NODE, REPLY_NODES = 2.0, 100
NO_REPLY = "sent no reply within"  # the start of a silent node's failure (a TimeoutError's text)
# a reply that carries an error, whose reason is "<class 'X'>:<'message'>" for an exception raised in a ClientApp
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


def no_reply(seconds: float, cid: str) -> NoReplyError:
    """The failure of a node that sent no reply within ``seconds`` (the same text for every silent node: one cause)."""
    return NoReplyError(f"{NO_REPLY} {seconds:g} s", cid=cid)


def raised_in_client(reason: str, cid: str) -> NodeError:
    """The failure of a node whose reply carries Flower's error ``reason``."""
    return NodeError(CLIENT_ERROR.format(reason=reason), cid=cid)


def client_error(text: str) -> tuple[str, str] | None:
    """The class name and message of a ClientApp's exception in Flower's :data:`CLIENT_ERROR` text, else ``None``."""
    raised = CLIENT_RAISED.search(text)
    return (raised.group(1), raised.group(2)) if raised else None


def reply_seconds(timeout: float, asked: int) -> float:
    """Seconds the server waits for ``asked`` nodes' answers: ``timeout``, else the default scaled to ``asked``.

    The default is ``REPLY_S`` plus ``REPLY_S_PER_NODE`` for each node beyond ``REPLY_NODES``.
    """
    return timeout if timeout > 0 else REPLY_S + REPLY_S_PER_NODE * max(0, asked - REPLY_NODES)
