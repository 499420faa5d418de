"""A fleet of nodes that answer in this process: the server's preflight and rounds without Flower's grid.

:class:`NodeFleet` is a :class:`strategies.nodes.preflight.Fleet` over objects that answer the
preflight as a stamen client does (``get_properties(config) -> dict``), keyed by their
``cid``: a test's stand-in nodes, a benchmark's agents. A node that raises answers with
its exception, as a failed ``query`` message does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from strategies.contracts.payload import Scalar
from strategies.nodes.preflight import Answer


class AnsweringNode(Protocol):
    """What :class:`NodeFleet` asks of a node: its id and its answer to the preflight."""

    cid: str

    def get_properties(self, config: dict[str, Scalar]) -> Mapping[str, Scalar]: ...


class NodeFleet:
    """``nodes`` (module docstring), connected until unregistered; ``asked``: every question's node ids."""

    def __init__(self, *nodes: AnsweringNode) -> None:
        self.nodes = {node.cid: node for node in nodes}
        self.asked: list[list[str]] = []

    def register(self, node: AnsweringNode) -> None:
        self.nodes[node.cid] = node

    def unregister(self, cid: str) -> None:
        del self.nodes[cid]

    def node_ids(self) -> list[str]:
        return list(self.nodes)

    def wait_for(self, count: int, timeout: float) -> bool:
        return len(self.nodes) >= count

    def ask(self, cids: list[str], config: dict[str, Scalar], reply_s: float) -> list[Answer]:
        self.asked.append(list(cids))
        answers: list[Answer] = []
        for cid in cids:
            try:
                answers.append(dict(self.nodes[cid].get_properties(dict(config))))
            except Exception as err:
                answers.append(err)
        return answers
