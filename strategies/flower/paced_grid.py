"""A Flower ``Grid`` that waits for replies on a short interval, in one pull loop for every caller.

Flower 1.42's deployed grid (``flwr/superlink/grid/http_grid.py``, ``HttpGrid.send_and_receive``)
pushes a phase's messages and then pulls their replies every 3 s, a hard-coded sleep:
a reply that came back in 0.2 s waits up to 3 s more before the ServerApp sees it.

:class:`PacedGrid` wraps any grid and keeps its every call but one: ``send_and_receive``
pushes through the wrapped grid (``Grid.push_messages``, public) and waits for the replies
while one pull loop, shared by every thread that waits, asks the wrapped grid
(``Grid.pull_messages``, public) for all the replies awaited, at most once per
``pull-interval`` seconds, so the SuperLink sees ``1 / pull-interval`` pulls a second
however many phases wait.

A phase may also be pushed now and awaited later (:meth:`PacedGrid.send`, then
:meth:`PacedGrid.receive`): the round engine pushes round r's evaluation and
round r+1's fit together where the grid delivers each node's messages in the order they
were pushed (:attr:`PacedGrid.delivers_in_order`), so that a SuperNode finds the fit
waiting when it has answered the evaluation, instead of sleeping 3 s first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from logging import INFO

from flwr.app import Message, RecordDict
from flwr.common.logger import log
from flwr.proto.node_pb2 import NodeInfo  # Grid's own annotation (flwr/serverapp/grid/grid.py)
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.superlink.grid.http_grid import HttpGrid
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

FLOWER_POLLING_GRIDS = (HttpGrid, InMemoryGrid)  # their send_and_receive sleeps between pulls
# Flower's SuperLink hands a node its messages one per pull, oldest first (linkstate get_message_ins: the
# in-memory state in insertion order, the SQL state by created_at), and a SuperNode answers one message before
# it pulls the next (supernode/start_client_internal.py, _push_messages). The simulation engine runs a node's
# messages on whichever backend worker is free, so two of them may run at once: it is not listed.
IN_ORDER_GRIDS = (HttpGrid,)
# A simulation's pull is a look-up in the server's own process, not a request. B4 quick (python -m bench.overhead
# --quick --pull-intervals 0.02 0.01, docs/benchmarks.md): Per-FedAvg HF's 10-client round 0.607 s at 0.1, 0.509 s at
# 0.02, 0.521 s at 0.01; the run's CPU 22.6, 21.7 and 24.6 s. Below 0.02 buys nothing: Flower's engine itself hands
# messages to its workers every 0.1 s (server/superlink/fleet/vce/vce_api.py, add_messages_to_queue).
SIMULATED_PULL_INTERVAL = 0.02


def is_deployed(grid: Grid) -> bool:
    """Whether ``grid`` (or the grid a :class:`PacedGrid` wraps) is Flower's deployed grid: the wall clock's."""
    return isinstance(grid.grid if isinstance(grid, PacedGrid) else grid, HttpGrid)


def delivers_in_order(grid: Grid) -> bool:
    """Whether ``grid`` runs each node's messages one after another, in the order they were pushed.

    Flower's deployed grid does; a grid of another kind says so with a true
    ``delivers_in_order`` attribute (stamen's in-process grid does; a :class:`PacedGrid`
    answers for the grid it wraps).
    """
    return isinstance(grid, IN_ORDER_GRIDS) or getattr(grid, "delivers_in_order", False) is True


def paced(grid: Grid, interval: float) -> Grid:
    """``grid`` in a :class:`PacedGrid` where it is one of Flower's polling grids; any other grid as it is.

    Flower's deployed grid (``HttpGrid``, 3 s) and its simulation grid (``InMemoryGrid``,
    0.1 s) wait by polling; a grid of another kind (a test's, an app's) keeps its own wait
    (and its rounds do not overlap: that needs :meth:`PacedGrid.send`). A deployed grid is
    pulled every ``interval`` s (``pull-interval``: each pull is a request to the SuperLink);
    the simulation's in-memory grid every :data:`SIMULATED_PULL_INTERVAL` s at most.
    """
    if isinstance(grid, PacedGrid) or not isinstance(grid, FLOWER_POLLING_GRIDS):
        return grid
    if isinstance(grid, InMemoryGrid):
        interval = min(interval, SIMULATED_PULL_INTERVAL)
    return PacedGrid(grid=grid, interval=interval)


@contextmanager
def paced_run(grid: Grid, interval: float) -> Iterator[Grid]:
    """``paced(grid, interval)`` for a run; afterwards, one log line of its pulls (when it was paced)."""
    run_grid = paced(grid, interval)
    try:
        yield run_grid
    finally:
        if isinstance(run_grid, PacedGrid):
            log(INFO, "stamen: %s", run_grid.report())


class Pending:
    """Messages pushed and not yet awaited: their ids, the replies pulled so far, and the event that wakes a waiter."""

    def __init__(self, message_ids: set[str]) -> None:
        self.awaited = message_ids
        self.replies: list[Message] = []
        self.woken = threading.Event()


class PacedGrid(Grid):
    """``grid`` with its replies pulled every ``interval`` seconds by one loop (see the module's docstring).

    Parameters
    ----------
    grid
        The grid Flower handed the ServerApp.
    interval
        Seconds between two pulls of the replies (the ``pull-interval`` key).

    """

    def __init__(self, *, grid: Grid, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"pull interval must be positive, got {interval!r}")
        self.grid = grid
        self.interval = interval
        self.pulls = 0  # how many pulls the loop made (its one-line report, the SuperLink's request rate)
        self.created = time.monotonic()
        self._waiters: list[Pending] = []
        self._lock = threading.Lock()  # guards the waiters and the time of the last pull
        self._pulling = threading.Lock()  # held by the one thread pulling for everyone
        self._last_pull = float("-inf")

    # ------------------------------------------------------------------ the wrapped grid, unchanged

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        return self.grid.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:  # fmt: skip
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def report(self) -> str:
        """One line: the pulls made, over how long, and their rate (each pull is one request to the SuperLink)."""
        seconds = time.monotonic() - self.created
        return (f"{self.pulls} pulls of replies in {seconds:.1f} s ({self.pulls / max(seconds, 1e-9):.1f}/s; at most "
                f"one every {self.interval:g} s while the server waits)")  # fmt: skip

    # ------------------------------------------------------------------ the paced wait

    @property
    def delivers_in_order(self) -> bool:
        return delivers_in_order(self.grid)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then the replies that come within ``timeout`` seconds (``None``: wait for all)."""
        return self.receive(self.send(messages), timeout=timeout)

    def send(self, messages: Iterable[Message]) -> Pending:
        """Push ``messages`` now; their replies are pulled with the others awaited until :meth:`receive` takes them."""
        waiter = Pending(set(self.grid.push_messages(messages)))
        with self._lock:
            self._waiters.append(waiter)
        return waiter

    def receive(self, waiter: Pending, *, timeout: float | None = None, enough: int = 0) -> list[Message]:
        """The replies to ``waiter``'s messages that came by now or come within ``timeout`` seconds from now.

        With ``enough`` > 0 it returns as soon as that many replies came (a deadline round's
        target); the others are no longer pulled.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while (waiter.awaited and (deadline is None or time.monotonic() < deadline)
                   and not 0 < enough <= len(waiter.replies)):  # fmt: skip
                self._pull_if_due()
                if waiter.awaited:
                    waiter.woken.wait(self._until_next_pull(deadline))
                    waiter.woken.clear()
        finally:
            with self._lock:
                self._waiters.remove(waiter)
        return waiter.replies

    def discard(self, waiter: Pending) -> None:
        """Stop pulling the replies to ``waiter``'s messages (a run that stops with a phase in flight)."""
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _until_next_pull(self, deadline: float | None) -> float:
        now = time.monotonic()
        wait = max(self._last_pull + self.interval - now, 0.001)
        return wait if deadline is None else max(min(wait, deadline - now), 0.0)

    def _pull_if_due(self) -> None:
        """Pull every awaited reply once, if ``interval`` has passed since the last pull and no one else is pulling."""
        if not self._pulling.acquire(blocking=False):
            return
        try:
            with self._lock:
                if time.monotonic() - self._last_pull < self.interval:
                    return
                self._last_pull = time.monotonic()
                awaited = {message_id for waiter in self._waiters for message_id in waiter.awaited}
            if not awaited:
                return
            replies = list(self.grid.pull_messages(awaited))
            self.pulls += 1
            with self._lock:
                for waiter in self._waiters:
                    mine = [r for r in replies if r.metadata.reply_to_message_id in waiter.awaited]
                    if mine:
                        waiter.replies.extend(mine)
                        waiter.awaited.difference_update(r.metadata.reply_to_message_id for r in mine)
                        waiter.woken.set()
        finally:
            self._pulling.release()
