"""The paced grid: replies seen within one pull interval, one pull loop however many threads wait."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from strategies.flower.paced_grid import PacedGrid


class TimedGrid(Grid):
    """A grid whose node ``n`` replies ``delays[n]`` seconds after a message is pushed; it counts pulls."""

    def __init__(self, delays: dict[int, float]) -> None:
        self.delays = delays
        self.ready: dict[str, tuple[float, int]] = {}  # message id -> (when its reply is there, node)
        self.pull_times: list[float] = []
        self.pulled_ids: list[set[str]] = []
        self.lock = threading.Lock()

    def set_run(self, run):
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.delays)

    def push_messages(self, messages):
        ids = []
        with self.lock:
            for message in messages:
                message_id = f"m{len(self.ready)}"
                self.ready[message_id] = (time.monotonic() + self.delays[message.metadata.dst_node_id],
                                          message.metadata.dst_node_id)  # fmt: skip
                ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        with self.lock:
            self.pull_times.append(now)
            self.pulled_ids.append(set(message_ids))
            replies = []
            for message_id in message_ids:
                when, node = self.ready[message_id]
                if when <= now:
                    reply = Message(content=RecordDict(), dst_node_id=0, message_type="train", group_id="1")
                    reply.metadata.__dict__["_reply_to_message_id"] = message_id
                    reply.metadata.__dict__["_src_node_id"] = node
                    replies.append(reply)
                    self.ready[message_id] = (float("inf"), node)  # a reply is pulled once
            return replies

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("the paced grid must not call the wrapped grid's own wait")


@pytest.fixture(autouse=True)
def task_identity():
    """Flower stamps a Message with the task it runs in; a ServerApp's own, as a deployed one has it."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def message_to(node: int) -> Message:
    return Message(content=RecordDict(), dst_node_id=node, message_type="train", group_id="1")


def test_a_reply_is_seen_within_one_interval_not_flowers_three_seconds():
    grid = TimedGrid({1: 0.05, 2: 0.15})
    paced = PacedGrid(grid=grid, interval=0.02)
    started = time.monotonic()
    replies = list(paced.send_and_receive([message_to(1), message_to(2)], timeout=10))
    took = time.monotonic() - started
    assert sorted(r.metadata.src_node_id for r in replies) == [1, 2]
    assert 0.15 <= took < 2.0  # the slower reply and a pull interval or so, never Flower's 3 s a pull
    gaps = sorted(b - a for a, b in zip(grid.pull_times, grid.pull_times[1:], strict=False))
    # paced, not a busy loop: the pulls start an interval apart (the times here are taken inside each pull,
    # a few ms of thread scheduling after its start, so one gap may read a little short)
    assert gaps[len(gaps) // 2] >= 0.02 * 0.95 and gaps[0] >= 0.02 * 0.5, gaps


def test_a_timeout_returns_the_replies_that_came_and_no_more():
    grid = TimedGrid({1: 0.0, 2: 60.0})
    paced = PacedGrid(grid=grid, interval=0.02)
    started = time.monotonic()
    replies = list(paced.send_and_receive([message_to(1), message_to(2)], timeout=0.3))
    assert [r.metadata.src_node_id for r in replies] == [1]
    assert 0.3 <= time.monotonic() - started < 2.0


def test_threads_waiting_at_once_share_one_pull_loop_and_each_gets_its_own_reply():
    nodes = 32
    grid = TimedGrid({n: 0.3 for n in range(1, nodes + 1)})
    paced = PacedGrid(grid=grid, interval=0.05)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=nodes) as pool:  # a thread and a call per waiting phase
        answers = list(pool.map(lambda n: list(paced.send_and_receive([message_to(n)])), range(1, nodes + 1)))
    waited = time.monotonic() - started
    assert [[r.metadata.src_node_id for r in answer] for answer in answers] == [[n] for n in range(1, nodes + 1)]
    # one loop: at most one pull per 0.05 s of waiting in all (one loop per thread: 32 times that), each pull
    # asking for every reply awaited then
    assert len(grid.pull_times) <= waited / 0.05 + 2, (len(grid.pull_times), waited)
    assert max(len(ids) for ids in grid.pulled_ids) == nodes
    assert paced.pulls == len(grid.pull_times)


def test_the_wrapped_grid_answers_everything_else():
    grid = TimedGrid({7: 0.0})
    paced = PacedGrid(grid=grid, interval=0.1)
    assert isinstance(paced, Grid) and list(paced.get_node_ids()) == [7]
    assert [n.node_id for n in paced.get_nodes()] == [7]
    with pytest.raises(ValueError, match="pull interval must be positive"):
        PacedGrid(grid=grid, interval=0.0)


def test_only_flowers_polling_grids_are_paced(caplog):
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from strategies.flower.paced_grid import SIMULATED_PULL_INTERVAL, paced, paced_run

    class Factory:
        def state(self):
            return None

    simulation = InMemoryGrid(state_factory=Factory())  # what flwr-simulation hands a ServerApp (0.1 s pulls)
    assert isinstance(paced(simulation, 0.05), PacedGrid) and paced(simulation, 0.05).grid is simulation
    own = TimedGrid({1: 0.0})  # a grid of another kind (a test's, an app's) keeps its own wait
    assert paced(own, 0.05) is own
    twice = paced(simulation, 0.05)
    assert paced(twice, 0.05) is twice
    # a simulation's pulls are look-ups in this process: every 0.02 s at most, whatever pull-interval says
    assert paced(simulation, 0.1).interval == SIMULATED_PULL_INTERVAL == 0.02
    assert paced(simulation, 0.01).interval == 0.01
    from flwr.superlink.grid.http_grid import HttpGrid

    deployed = HttpGrid.__new__(HttpGrid)  # a deployment's pulls are requests to the SuperLink: pull-interval's
    assert paced(deployed, 0.1).interval == 0.1
    with caplog.at_level("INFO", logger="flwr"):
        with paced_run(simulation, 0.05) as run_grid:  # a run: paced, and its pulls reported once at the end
            assert isinstance(run_grid, PacedGrid)
        with paced_run(own, 0.05) as run_grid:
            assert run_grid is own
    assert sum("pulls of replies in" in r.getMessage() for r in caplog.records) == 1
