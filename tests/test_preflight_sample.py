"""A preflight over a sample of the nodes: the server numbers the simulated nodes, and the run is the same.

Node ids are chosen so that their sorted order is the reverse of the partitions the
nodes were built with: after a sampled preflight every node is sent another partition
than its own, loads it, and the run must give the same models and losses as a run
whose preflight asked every node.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import settings

from app.local.inprocess import InProcessRun
from app.registry import METHODS

NODES, ROUNDS = 12, 3


def run(method: str, sample: int, **overrides) -> tuple[list[np.ndarray], list[float], object]:
    config = {**METHODS[method].contract.example, "fraction_fit": 0.34, "fraction_evaluate": 0.5, "eval_every": 1,
              "min_available_clients": NODES, "preflight_sample": sample, "num_server_rounds": ROUNDS, **overrides}
    run_settings = settings(**{k.replace("-", "_"): v for k, v in config.items()})
    # each partition's client built as the ClientApp builds it; sorted node ids: partitions reversed
    played = InProcessRun(run_config=run_settings.as_run_config(), num_clients=NODES,
                          node_ids=[100 + NODES - 1 - partition for partition in range(NODES)])  # fmt: skip
    losses = []
    for _ in range(ROUNDS):
        played.step()
        metrics = played.evaluate()
        losses.append(metrics["loss"] if metrics.get("eval-clients") else None)
        played.strategy.end_round(played.round)
    return played.global_model, losses, played.strategy


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_sampled_preflight_gives_the_run_of_a_full_one(method, caplog):
    full_model, full_losses, full = run(method, 0)
    caplog.clear()
    sampled_model, sampled_losses, sampled = run(method, 4)
    assert f"preflight: 4 of {NODES} connected clients asked (preflight-sample)" in caplog.text
    assert sampled_losses == full_losses
    for a, b in zip(full_model, sampled_model, strict=True):
        np.testing.assert_array_equal(a, b)
    # the server numbered every node without asking it; only the sample's data is reported
    assert sorted(sampled.nodes.partition_of(str(100 + i)) for i in range(NODES)) == list(range(NODES))
    assert sampled.nodes.partition_of("100") == 0 and full.nodes.partition_of("100") == NODES - 1
    summary = sampled.summary("completed")
    assert summary["nodes-asked"] == 4 and len(summary["nodes"]) == 4
    assert "nodes-asked" not in full.summary("completed")


def test_a_sample_larger_than_the_federation_asks_every_node():
    _, _, strategy = run("fedavg", NODES + 5)
    assert not strategy.nodes.sampled and len(strategy.summary("completed")["nodes"]) == NODES


@pytest.mark.parametrize("sample", [0, 4])
def test_a_batch_larger_than_every_training_set_is_warned_of_with_or_without_a_sample(sample, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run("fedavg", sample, batch_size=100_000)
    warnings = [r.getMessage() for r in caplog.records if "'batch-size'" in r.getMessage()]
    asked = "the 4 clients asked" if sample else "every client"
    assert len(warnings) == 1 and f"100000 exceeds the training set of {asked}" in warnings[0]


def test_a_batch_that_fits_is_not_warned_of(caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run("fedavg", 4, batch_size=2)
    assert not [r for r in caplog.records if "'batch-size'" in r.getMessage()]
