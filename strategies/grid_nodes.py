"""The nodes behind a Message API grid, as the client manager stamen's parts read them.

Flower's legacy path keeps a ``ClientManager`` up to date from a background thread; the
Message API hands a strategy the ``Grid`` instead. :class:`GridNodes` is a client
manager read from the grid when asked, so the node directory, the preflight and the
sampling work unchanged on both paths.
"""

from __future__ import annotations

import time

from flwr.server.client_manager import SimpleClientManager
from flwr.serverapp import Grid

from strategies.grid_transport import QueryNode

POLL_S = 1.0  # how often waiting for nodes asks the grid again


class GridNodes(SimpleClientManager):
    """The nodes connected to ``grid``, one :class:`QueryNode` each, refreshed whenever they are read.

    Parameters
    ----------
    grid
        The grid the ServerApp was given.

    """

    def __init__(self, *, grid: Grid) -> None:
        super().__init__()
        self.grid = grid

    def refresh(self) -> None:
        """Register the nodes that joined the grid and forget those that left."""
        ids = set(self.grid.get_node_ids())
        for proxy in list(self.clients.values()):
            if proxy.node_id not in ids:
                self.unregister(proxy)
        for node_id in sorted(ids - {proxy.node_id for proxy in self.clients.values()}):
            self.register(QueryNode(node_id=node_id, grid=self.grid))

    def all(self) -> dict[str, QueryNode]:
        self.refresh()
        return super().all()

    def num_available(self) -> int:
        self.refresh()
        return super().num_available()

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        """Whether ``num_clients`` nodes connected within ``timeout`` seconds (asking the grid every second)."""
        deadline = time.monotonic() + timeout
        while self.num_available() < num_clients:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True
