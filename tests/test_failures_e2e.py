"""Bad input through ``flwr run``: the run stops before round 1, in a few lines that name the key or the file.

The session's SuperLink serves the three runs, submitted together so that their
start-ups overlap. A client-side failure (no GPU, a truncated data file) is answered as
data and condensed by the server's preflight, so the console shows one line per cause,
not a Ray traceback per client; a server-side one (a combination matrix that is not
left-stochastic) stops the run before any client loads data. Unit versions:
``tests/test_failures.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.e2e
CLIENTS = 10
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


def cuda_run(folder: Path) -> dict:
    return {"device": "cuda", "num-server-rounds": 2, "diffusion-participation-per-agent": "0.5,0.5"}


def truncated_leaf_run(folder: Path) -> dict:
    data = folder / "femnist"
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (data / split).mkdir(parents=True)
        users = [f"w{i}" for i in range(CLIENTS)]
        samples = {u: {"x": rng.random((4, 784)).round(3).tolist(), "y": [1, 2, 3, 4]} for u in users}
        blob = {"users": users, "num_samples": [4] * CLIENTS, "user_data": samples}
        (data / split / "part.json").write_text(json.dumps(blob))
    broken = data / "train" / "part.json"
    broken.write_text(broken.read_text()[:5000])
    return {"dataset": "femnist", "data-dir": str(data), "partitioner": "natural", "model": "cnn-small",
            "batch-size": 2, "perfedavg-outer-batch-size": 2, "perfedavg-hessian-batch-size": 2,
            "adapt-batch-size": 2, "num-server-rounds": 2}  # fmt: skip


def bad_matrix_run(folder: Path) -> dict:
    matrix = folder / "A.txt"
    np.savetxt(matrix, np.full((CLIENTS, CLIENTS), 0.11))  # columns sum to 1.1
    return {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
            "diffusion-graph": "full", "diffusion-combination": "file",
            "diffusion-combination-file": str(matrix)}  # fmt: skip


BAD_RUNS = {"cuda": cuda_run, "leaf": truncated_leaf_run, "matrix": bad_matrix_run}


@pytest.fixture(scope="module")
def outcomes(local_simulation, tmp_path_factory) -> dict:
    """Each bad run's outcome and its results folder (``<folder>/<name>``), by name."""
    folders, configs = {}, {}
    for name, make in BAD_RUNS.items():
        if name == "cuda" and torch.cuda.is_available():
            continue
        folders[name] = tmp_path_factory.mktemp(name)
        configs[name] = {**make(folders[name]), "results-dir": str(folders[name]), "run-name": name}
    done = local_simulation.run_many(configs, num_supernodes=CLIENTS, ahead=len(configs), timeout_s=300)
    return {name: (done[name], folders[name] / name) for name in configs}


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@NO_CUDA
def test_cuda_on_a_cpu_machine_fails_in_the_preflight_in_under_80_lines(outcomes):
    outcome, run_dir = outcomes["cuda"]
    print(outcome.log)  # shown with -s: what a user sees
    assert not outcome.ok
    lines = outcome.log.splitlines()
    assert len(lines) < 80, f"{len(lines)} lines:\n{outcome.log}"
    assert f"{CLIENTS} of {CLIENTS} clients (partitions 0-9): run config key 'device': 'cuda' was asked for but " \
           "torch sees no CUDA device" in outcome.log  # fmt: skip
    assert "'diffusion-participation-per-agent' (a diffusion key; strategy is 'perfedavg')" in outcome.log
    assert "Found no NVIDIA driver" not in outcome.log
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "'device': 'cuda'" in summary["reason"]
    details = (run_dir / "preflight-errors.log").read_text()
    assert details.count("=====") == CLIENTS and str(run_dir / "preflight-errors.log") in outcome.log


def test_a_truncated_leaf_file_is_named_by_the_preflight(outcomes):
    outcome, run_dir = outcomes["leaf"]
    broken = run_dir.parent / "femnist" / "train" / "part.json"
    assert not outcome.ok
    assert f"LEAF file {broken} is not valid JSON" in outcome.log, outcome.log_tail
    assert len(outcome.log.splitlines()) < 80, outcome.log
    assert summary_of(run_dir)["status"] == "failed"


def test_a_bad_combination_file_stops_the_server_before_any_client_works(outcomes):
    outcome, run_dir = outcomes["matrix"]
    assert not outcome.ok
    assert f"diffusion-combination-file {run_dir.parent / 'A.txt'}: combination matrix column 0 sums to 1.1" \
           in outcome.log  # fmt: skip
    assert "preflight" not in outcome.log  # no client was asked anything
    # nothing ran: the folder holds only the summary saying why (flwr run exits 0 either way)
    assert sorted(p.name for p in run_dir.iterdir()) == ["summary.json"]
    assert summary_of(run_dir)["refused"] is True
    assert len(outcome.log.splitlines()) < 80, outcome.log
