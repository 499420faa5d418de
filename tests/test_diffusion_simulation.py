"""Asynchronous diffusion through Flower's simulation engine: every agent's iterates, and 200 agents.

The theory (the network mean heads for the Perron-weighted optimum, 2,000 rounds) is
checked in process by ``tests/test_diffusion.py``; here a short ``flwr run`` must give
every agent's iterates of the in-process driver for the same seed, round by round, and
write the snapshots, the topology and a record per round.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.local.inprocess import InProcessRun

pytestmark = pytest.mark.e2e
AGENTS, ROUNDS = 5, 20
THEORY = {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
          "synthetic-alpha": 2.0, "synthetic-beta": 0.5, "diffusion-mode": "diffusion", "diffusion-graph": "star",
          "diffusion-combination": "uniform", "diffusion-participation-per-agent": "1.0,0.5,0.5,0.5,0.5",
          "diffusion-neighbour-probability": 1.0, "diffusion-mu": 0.05, "local-steps": 1, "batch-size": 200,
          "num-server-rounds": ROUNDS, "eval-every": ROUNDS, "diffusion-snapshot-every": 1, "seed": 0}  # fmt: skip
BIG = {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
       "diffusion-mode": "diffusion", "diffusion-graph": "ring", "diffusion-participation": 0.3,
       "diffusion-neighbour-probability": 0.7, "diffusion-mu": 0.05, "local-steps": 2, "batch-size": 20,
       "num-server-rounds": 3, "eval-every": 3}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory, local_simulation):
    results = tmp_path_factory.mktemp("results")
    common = {"results-dir": str(results)}
    sim = local_simulation
    theory = sim.submit(run_config={**THEORY, **common, "run-name": "theory"}, num_supernodes=AGENTS)
    big = sim.submit(run_config={**BIG, **common, "run-name": "big"}, num_supernodes=200)
    theory, big = sim.wait(theory, timeout_s=600), sim.wait(big, timeout_s=600)
    return (theory, results / "theory"), (big, results / "big")


def test_flower_gives_every_agent_the_iterates_of_the_in_process_driver(runs):
    (outcome, run_dir) = runs[0]
    assert outcome.ok, outcome.log_tail
    flower = np.load(run_dir / "agents.npz")["models"]
    assert flower.shape == (ROUNDS, AGENTS, 10)
    local = []
    run = InProcessRun(run_config=THEORY, num_clients=AGENTS)
    run.run(ROUNDS, lambda _, strategy: local.append(strategy.agents.copy()))
    np.testing.assert_array_equal(flower, np.stack(local).astype(flower.dtype))
    topology = np.load(run_dir / "topology.npz")
    # what the server combined with (their closed forms: tests/test_diffusion.py); the centre weighs most
    for key in ("weights", "limit_weights"):
        np.testing.assert_allclose(topology[key], getattr(run.strategy.network, key))
    assert topology["weights"].sum() == pytest.approx(1) and topology["weights"].argmax() == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert all(r["clients-failed"] == 0 and r["disagreement"] >= 0 for r in records)
    # the centre (q = 1) takes part every round, the four others each about half the time: 3 +- 4 sd of a 20-round mean
    participated = [r["agents-participated"] for r in records]
    assert all(1 <= n <= AGENTS for n in participated) and abs(np.mean(participated) - 3) < 0.9
    assert records[-1]["eval-clients"] == AGENTS and "loss" in records[-1]


def test_two_hundred_agents_on_the_small_model(runs):
    outcome, run_dir = runs[1]
    assert outcome.ok, outcome.log_tail
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for record in records:  # participation 0.3 of 200 agents: 60 +- 4 standard deviations (26)
        assert 34 <= record["clients-sampled"] <= 86
        assert record["clients-succeeded"] == record["clients-sampled"] == record["agents-participated"]
    assert records[-1]["eval-clients"] == 200
    assert "diffusion: 200 agents" in outcome.log and "40 bytes per agent model" in outcome.log
