"""Bad input through ``flwr run``: the run stops before round 1, in a few lines that name the key or the file.

One private SuperLink serves the three runs. A client-side failure (no GPU, a truncated
data file) is answered as data and condensed by the server's preflight, so the console
shows one line per cause, not a Ray traceback per client; a server-side one (a
combination matrix that is not left-stochastic) stops the run before any client loads
data. Unit versions: ``tests/test_failures.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.e2e
CLIENTS = 10


@pytest.fixture(scope="module")
def sim(local_simulation):
    return local_simulation


def summary_of(folder):
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_on_a_cpu_machine_fails_in_the_preflight_in_under_80_lines(sim, tmp_path):
    config = {"device": "cuda", "num-server-rounds": 2, "results-dir": str(tmp_path), "run-name": "cuda",
              "diffusion-participation-per-agent": "0.5,0.5"}  # fmt: skip
    outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=300)
    print(outcome.log)  # shown with -s: what a user sees
    assert not outcome.ok
    lines = outcome.log.splitlines()
    assert len(lines) < 80, f"{len(lines)} lines:\n{outcome.log}"
    assert f"{CLIENTS} of {CLIENTS} clients (partitions 0-9): run config key 'device': 'cuda' was asked for but " \
           "torch sees no CUDA device" in outcome.log  # fmt: skip
    assert "'diffusion-participation-per-agent' (a diffusion key; strategy is 'perfedavg')" in outcome.log
    assert "Found no NVIDIA driver" not in outcome.log
    summary = summary_of(tmp_path / "cuda")
    assert summary["status"] == "failed" and "'device': 'cuda'" in summary["reason"]
    details = (tmp_path / "cuda" / "preflight-errors.log").read_text()
    assert details.count("=====") == CLIENTS and str(tmp_path / "cuda" / "preflight-errors.log") in outcome.log


def test_a_truncated_leaf_file_is_named_by_the_preflight(sim, tmp_path):
    data = tmp_path / "femnist"
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (data / split).mkdir(parents=True)
        users = [f"w{i}" for i in range(CLIENTS)]
        blob = {"users": users, "num_samples": [4] * CLIENTS,
                "user_data": {u: {"x": rng.random((4, 784)).round(3).tolist(), "y": [1, 2, 3, 4]} for u in users}}
        (data / split / "part.json").write_text(json.dumps(blob))  # fmt: skip
    broken = data / "train" / "part.json"
    broken.write_text(broken.read_text()[:5000])
    config = {"dataset": "femnist", "data-dir": str(data), "partitioner": "natural", "model": "cnn-small",
              "batch-size": 2, "perfedavg-outer-batch-size": 2, "perfedavg-hessian-batch-size": 2,
              "adapt-batch-size": 2, "num-server-rounds": 2, "results-dir": str(tmp_path),
              "run-name": "leaf"}  # fmt: skip
    outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=300)
    assert not outcome.ok
    assert f"LEAF file {broken} is not valid JSON" in outcome.log, outcome.log_tail
    assert len(outcome.log.splitlines()) < 80, outcome.log
    assert summary_of(tmp_path / "leaf")["status"] == "failed"


def test_a_bad_combination_file_stops_the_server_before_any_client_works(sim, tmp_path):
    matrix = tmp_path / "A.txt"
    np.savetxt(matrix, np.full((CLIENTS, CLIENTS), 0.11))  # columns sum to 1.1
    config = {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
              "diffusion-graph": "full", "diffusion-combination": "file", "diffusion-combination-file": str(matrix),
              "results-dir": str(tmp_path), "run-name": "matrix"}  # fmt: skip
    outcome = sim.run(run_config=config, num_supernodes=CLIENTS, timeout_s=300)
    assert not outcome.ok
    assert f"diffusion-combination-file {matrix}: combination matrix column 0 sums to 1.1" in outcome.log
    assert "preflight" not in outcome.log  # no client was asked anything
    # nothing ran: the folder holds only the summary saying why (flwr run exits 0 either way)
    assert sorted(p.name for p in (tmp_path / "matrix").iterdir()) == ["summary.json"]
    assert summary_of(tmp_path / "matrix")["refused"] is True
    assert len(outcome.log.splitlines()) < 80, outcome.log
