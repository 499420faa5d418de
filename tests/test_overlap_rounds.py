"""``overlap-rounds``: round r+1's fit goes out with round r's evaluation, and the run stays the same run.

Runs through the round engine in this process (``app.local.message_grid``), on a
grid that answers each node's messages in push order, as a deployed SuperNode does.
Parametrised over ``app.registry.METHODS``: every method's records and final model with
the overlap equal those without it.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import CLIENTS, config_of, message_run, records

from app.local.message_grid import InProcessGrid
from app.message_methods import message_strategy
from app.registry import METHODS
from strategies.flower.paced_grid import PacedGrid, delivers_in_order

PACE = 0.001  # seconds between pulls: the in-process grid has every reply at once


class LoggedGrid(InProcessGrid):
    """An in-process grid that logs what it is asked, in order: ``("push", type, group id)`` and ``("pull", n)``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log: list[tuple] = []

    def push_messages(self, messages):
        messages = list(messages)
        self.log.extend(("push", m.metadata.message_type, m.metadata.group_id) for m in messages[:1])
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        self.log.append(("pull", len(replies)))
        return replies


class UnorderedGrid(LoggedGrid):
    delivers_in_order = False  # as Flower's simulation engine, which may run a node's two messages at once


def pushes(grid: LoggedGrid) -> list[tuple]:
    return [entry[1:] for entry in grid.log if entry[0] == "push"]


def overlapped(grid: LoggedGrid) -> list[int]:
    """The rounds whose fit was pushed before the replies to the evaluation pushed just before it were pulled."""
    rounds, evaluation_waiting = [], False
    for entry in grid.log:
        if entry[:2] == ("push", "evaluate"):
            evaluation_waiting = True
        elif entry[:2] == ("push", "train") and evaluation_waiting:
            rounds.append(int(entry[2]))
        elif entry[0] == "pull":
            evaluation_waiting = False
    return rounds


def run(config: dict, grid_class=LoggedGrid, *, paced: bool = True) -> tuple[object, LoggedGrid]:
    grid = grid_class(run_config=config, num_clients=CLIENTS)
    strategy = message_run(config, grid=PacedGrid(grid=grid, interval=PACE) if paced else grid)
    return strategy, grid


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_gives_the_same_records_and_model_with_and_without_the_overlap(name, tmp_path):
    first, first_grid = run(config_of(name, tmp_path, "apart", **{"eval-every": 1, "overlap-rounds": False}))
    second, second_grid = run(config_of(name, tmp_path, "overlapped", **{"eval-every": 1}))
    assert overlapped(first_grid) == [] and overlapped(second_grid) == [2, 3]
    assert pushes(first_grid) == pushes(second_grid)  # the same messages, in the same order
    apart, together = records(tmp_path, "apart"), records(tmp_path, "overlapped")
    assert [r["round"] for r in together] == [1, 2, 3]
    assert apart == together
    for one, other in zip(first.method.global_model, second.method.global_model, strict=True):
        np.testing.assert_array_equal(one, other)


def test_a_fit_goes_out_with_the_evaluation_only_where_the_next_round_may_begin(tmp_path):
    config = config_of("fedavg", tmp_path, "checkpointed", **{"eval-every": 1, "num-server-rounds": 5,
                                                              "checkpoint-every": 2})  # fmt: skip
    _, grid = run(config)
    assert overlapped(grid) == [2, 4]  # not after round 2 nor 4 (their checkpoints), nor after the last
    assert (tmp_path / "checkpointed" / "checkpoint.npz").exists()
    _, grid = run(config_of("fedavg", tmp_path, "sparse", **{"eval-every": 2, "num-server-rounds": 5}))
    assert overlapped(grid) == [3, 5]  # a round without an evaluation has nothing to send its fit with


@pytest.mark.parametrize(
    ("why", "extra", "grid_class", "paced"),
    [
        ("switched off", {"overlap-rounds": False}, LoggedGrid, True),
        ("a grid that may run a node's messages at once", {}, UnorderedGrid, True),
        ("a grid stamen does not pace (it cannot push a phase and wait later)", {}, LoggedGrid, False),
    ],
)
def test_no_fit_goes_out_early(why, extra, grid_class, paced, tmp_path):
    config = config_of("fedavg", tmp_path, "run", **{"eval-every": 1, **extra})
    _, grid = run(config, grid_class, paced=paced)
    assert overlapped(grid) == [], why


def test_a_method_whose_next_fit_reads_the_evaluation_is_never_overlapped(tmp_path, monkeypatch):
    fedavg = METHODS["fedavg"].client  # the method's contract, which its server is built with (Method.build)
    monkeypatch.setattr(fedavg, "contract", dataclasses.replace(fedavg.contract, overlaps_rounds=False))
    strategy, grid = run(config_of("fedavg", tmp_path, "run", **{"eval-every": 1}))
    assert strategy.method.contract.overlaps_rounds is False
    assert overlapped(grid) == []


def test_only_flowers_deployed_grid_and_grids_that_say_so_deliver_in_order():
    from flwr.superlink.grid.http_grid import HttpGrid
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    deployed, simulated = HttpGrid.__new__(HttpGrid), InMemoryGrid.__new__(InMemoryGrid)
    assert delivers_in_order(deployed) and delivers_in_order(PacedGrid(grid=deployed, interval=0.1))
    assert not delivers_in_order(simulated) and not delivers_in_order(PacedGrid(grid=simulated, interval=0.1))
    assert delivers_in_order(InProcessGrid.__new__(InProcessGrid))
    assert not delivers_in_order(UnorderedGrid.__new__(UnorderedGrid))


def test_a_run_that_stops_at_a_close_drops_the_fit_sent_with_its_evaluation(tmp_path):
    # FedAvg with a step of 1e4: every fit reply is non-finite from the first round or two (tests/test_divergence.py)
    config = {"strategy": "fedavg", "lr": 1e4, "num-server-rounds": 10, "stop-after-nonfinite": 2,
              "eval-every": 1, "results-dir": str(tmp_path), "run-name": "diverges"}  # fmt: skip
    grid = LoggedGrid(run_config=config, num_clients=10)
    paced = PacedGrid(grid=grid, interval=PACE)
    message_strategy("fedavg")(run_config=config).start(grid=paced)
    summary = json.loads((tmp_path / "diverges" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["rounds"] < 10
    assert overlapped(grid)[-1] == summary["rounds"] + 1  # the next round's fit had gone out with the last evaluation
    assert paced._waiters == []  # and its replies are no longer pulled
