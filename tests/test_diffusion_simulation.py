"""Asynchronous diffusion through Flower's simulation engine: the theory check and 200 agents."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.config import parse_settings
from datasets import load_client_data
from datasets.least_squares import least_squares_optimum

pytestmark = pytest.mark.e2e
AGENTS, ROUNDS = 5, 300
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


def test_network_mean_ends_nearer_the_weighted_optimum_than_the_plain_one(runs):
    (outcome, run_dir) = runs[0]
    assert outcome.ok, outcome.log_tail
    topology = np.load(run_dir / "topology.npz")
    agents = np.load(run_dir / "agents.npz")
    assert agents["models"].shape == (ROUNDS, AGENTS, 10)
    mean = agents["models"][ROUNDS // 2 :].mean(axis=(0, 1))  # network mean over the second half
    settings = parse_settings(THEORY)
    parts = [load_client_data(settings.data_spec(AGENTS), settings.partition_spec(AGENTS), k) for k in range(AGENTS)]
    xs, ys = [p.train_x for p in parts], [p.train_y for p in parts]
    w_seed = least_squares_optimum(xs, ys, topology["weights"])
    w_limit = least_squares_optimum(xs, ys, topology["limit_weights"])
    w_plain = least_squares_optimum(xs, ys, np.ones(AGENTS))
    assert np.linalg.norm(w_seed - w_plain) > 0.5
    assert np.linalg.norm(mean - w_seed) < 0.6 * np.linalg.norm(mean - w_plain)
    assert np.linalg.norm(mean - w_limit) < np.linalg.norm(mean - w_seed)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert all(r["clients-failed"] == 0 and r["disagreement"] >= 0 for r in records)
    # the centre (q = 1) takes part every round; the four others about half the time
    participated = np.mean([r["agents-participated"] for r in records])
    assert 1 + 4 * 0.5 - 0.4 < participated < 1 + 4 * 0.5 + 0.4
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
