"""One real simulation through Flower's engine (`flwr run`), checked by the run's status.

`flwr run --stream` exits 0 even when the run fails, so the launcher submits with
`--format json`, polls `flwr ls --run-id` for the status, and the results files are
read back. The private SuperLink is stopped at the end, whatever happened.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO

from app.launcher import LocalSimulation

ROUNDS, CLIENTS = 2, 4


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    config = {"num-server-rounds": ROUNDS, "eval-every": 1, "fraction-fit": 0.5, "results-dir": str(results),
              "run-name": "sim-test"}  # fmt: skip
    with LocalSimulation(app_dir=REPO) as sim:
        outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=300)  # the default: perfedavg hf
        baseline = sim.run(run_config={**config, "strategy": "fedavg", "run-name": "fedavg"}, num_supernodes=CLIENTS,
                           timeout_s=300)  # fmt: skip
        # a partition the embedded data cannot hold (250 training images per class)
        too_big = {**config, "images-per-class": 400, "run-name": "too-big"}
        refused = sim.run(run_config=too_big, num_supernodes=CLIENTS, timeout_s=300)
        # Per-FedAvg batches larger than the second-half clients' 12 images
        big_batch = sim.run(run_config={**config, "outer-batch-size": 40, "run-name": "big-batch"},
                            num_supernodes=CLIENTS, timeout_s=300)  # fmt: skip
        fathom_config = {**config, "strategy": "fathom", "num-server-rounds": 3, "fraction-fit": 1.0,
                         "local-epochs": 1.0, "batch-size": 8, "run-name": "fathom"}  # fmt: skip
        fathom = sim.run(run_config=fathom_config, num_supernodes=CLIENTS, timeout_s=300)
        marker = str(sim.home)
    yield (outcome, results / "sim-test", marker, refused, (baseline, results / "fedavg"), big_batch,
           (fathom, results / "fathom"))  # fmt: skip


def test_run_completes_and_leaves_no_process(finished_run):
    outcome, _, marker = finished_run[:3]
    assert outcome.ok, f"status {outcome.status}\n{outcome.log_tail}"
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout == b""


def test_results_files_hold_every_round(finished_run):
    run_dir = finished_run[1]
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    for record in rounds:
        assert record["clients-sampled"] == CLIENTS // 2 and record["clients-succeeded"] == CLIENTS // 2
        # perfedavg hf: 10 meta-steps of 4 gradient evaluations on each of the 2 sampled clients
        assert record["clients-failed"] == 0 and record["grad-evals"] == (CLIENTS // 2) * 10 * 4
        assert record["hp-variant"] == "hf" and record["strategy"] == "perfedavg"
        assert record["eval-clients"] == CLIENTS
        assert 0.0 <= record["accuracy-min"] <= record["accuracy"] <= record["accuracy-max"] <= 1.0
        assert record["train-loss"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["settings"]["dataset"] == "mnist-5k"
    assert summary["final"]["round"] == ROUNDS
    assert (run_dir / "accuracy.png").stat().st_size > 1000


def test_a_client_that_cannot_load_its_data_stops_the_run_before_training(finished_run):
    refused = finished_run[3]
    assert refused.status == "finished:failed"
    assert "stamen preflight" in refused.log
    assert "the training pool holds 250 images of class 0 but the split needs 1000" in refused.log
    assert "[round 1/" not in refused.log


def test_fedavg_baseline_runs_and_reports_the_same_metrics(finished_run):
    (baseline, run_dir), perfedavg_dir = finished_run[4], finished_run[1]
    assert baseline.ok, baseline.log_tail
    fedavg = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    perfedavg = [json.loads(line) for line in (perfedavg_dir / "metrics.jsonl").read_text().splitlines()]
    metric_keys = {k for k in perfedavg[-1] if not k.startswith("hp-")}
    assert metric_keys == {k for k in fedavg[-1] if not k.startswith("hp-")}
    assert fedavg[-1]["grad-evals"] == (CLIENTS // 2) * 10 and fedavg[-1]["strategy"] == "fedavg"


def test_batches_larger_than_a_clients_data_stop_the_run_before_training(finished_run):
    big_batch = finished_run[5]
    assert big_batch.status == "finished:failed"
    assert "clients cannot start" in big_batch.log
    assert "outer-batch-size 40 must be in [1, 12]" in big_batch.log  # a second-half client: 4 + 8 images
    assert "[round 1/" not in big_batch.log


def test_fathom_clients_receive_the_hyperparameters_the_strategy_moves_each_round(finished_run):
    fathom, run_dir = finished_run[6]
    assert fathom.ok, fathom.log_tail
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rounds) == 3
    for record in rounds:  # what every client received and used is what the strategy had in force
        assert record["client-lr-min"] == pytest.approx(record["hp-lr"], rel=1e-12)
        assert record["client-lr-max"] == pytest.approx(record["hp-lr"], rel=1e-12)
        assert -1.0 <= record["phi-mean"] <= 1.0
    assert rounds[0]["hp-lr"] == rounds[1]["hp-lr"] == 0.05  # H = 0 in round 1
    assert rounds[2]["hp-lr"] != rounds[1]["hp-lr"]  # H != 0 from round 2 on
    batch_sizes = [r["hp-batch-size"] for r in rounds]
    assert batch_sizes[0] == 8.0 and len(set(batch_sizes)) == 3  # G moves B every round
