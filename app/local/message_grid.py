"""A Flower ``Grid`` whose nodes answer in this process: the Message API path without the transport.

:class:`InProcessGrid` hands every message to a real Flower ``ClientApp`` (stamen's
own by default) with the node's ``Context``, as a simulated SuperNode
does, and every message and reply goes through Flower's wire encoding (protobuf) both
ways, so a record Flower could not send fails here too. A run of every method takes
seconds on it (``app/local/inprocess.py``, ``bench/method_records.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from uuid import uuid4

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Error
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

RUN_ID = 1
NODE_BASE = 1000  # node ids NODE_BASE + partition, clear of the SuperLink's own (1)


def node_context(run_config: Mapping[str, object], *, partition: int, num_clients: int) -> Context:
    """The ``Context`` Flower's simulation gives the SuperNode of ``partition``: its node config and a fresh state."""
    node_config = {"partition-id": partition, "num-partitions": num_clients}
    return Context(run_id=0, node_id=partition, node_config=node_config, state=RecordDict(),
                   run_config=dict(run_config))  # fmt: skip


def wired(message: Message) -> Message:
    """``message`` as the other side receives it: encoded to Flower's protobuf and decoded again."""
    return message_from_proto(message_to_proto(message))


class InProcessGrid(Grid):
    """Nodes (partitions ``0 .. num_clients - 1``) answered by ``client_app`` in this process.

    Parameters
    ----------
    run_config
        The run config every node is given.
    num_clients
        The simulated SuperNodes.
    client_app
        The ClientApp that answers; default: stamen's own (``app.client_app.app``).
    node_ids
        Each partition's node id; default ``NODE_BASE + partition``.

    """

    delivers_in_order = True  # each message is answered when pushed (strategies/paced_grid.py)

    def __init__(self, *, run_config: Mapping[str, object], num_clients: int, client_app: ClientApp | None = None,
                 node_ids: list[int] | None = None) -> None:  # fmt: skip
        if client_app is None:
            from app.client_app import app as client_app  # importing it builds stamen's ClientApp: only when used
        self.client_app = client_app
        ids = node_ids if node_ids is not None else [NODE_BASE + partition for partition in range(num_clients)]
        if len(set(ids)) != num_clients:
            raise ValueError(f"node_ids: {num_clients} distinct ids needed, got {ids!r}")
        self.contexts = {node: node_context(run_config, partition=partition, num_clients=num_clients)
                         for partition, node in enumerate(ids)}  # fmt: skip
        self._run = Run.create_empty(RUN_ID)
        # a ServerApp's process has these set: Flower's Message() reads them
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, SUPERLINK_NODE_ID, RUN_ID
        self._replies: dict[str, Message] = {}
        self.messages_sent = 0

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:  # fmt: skip
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp at once; its reply waits to be pulled."""
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message_id = str(uuid4())
            message.metadata.__dict__["_run_id"] = self._run.run_id
            self.messages_sent += 1
            received = wired(message)
            try:
                answer = self.client_app(received, self.contexts[message.metadata.dst_node_id])
            except Exception as err:  # as a SuperNode answers a ClientApp that raised: a reply with the error
                answer = Message(Error(code=0, reason=f"{type(err)}:<'{err}'>"), reply_to=received)
            try:
                self._replies[message_id] = wired(answer)
            except ValueError:  # a reply Flower cannot encode is never pushed (run_clientapp): no reply comes
                pass
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
