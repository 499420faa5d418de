"""Failures a person can read: each bad input stops early, in one line naming the key or the file.

The end-to-end versions (through ``flwr run``, with the console's line count) are in
``tests/test_failures_e2e.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, FakeNode, settings
from flwr.common import Context, RecordDict

from app.client_app import client_fn
from app.config import ConfigError, check_on_server, ignored_keys, parse_settings
from app.local.message_grid import NODE_BASE, InProcessGrid
from app.message_client import serving
from clients.runtime import torch_device
from datasets import DataUnavailableError
from datasets.leaf import load_femnist
from strategies.base import FederatedStrategy
from strategies.flower.rounds import Rounds
from strategies.methods.combinations import combination_matrix
from strategies.methods.graphs import make_graph
from strategies.nodes.failure_groups import ranges
from strategies.rounds.recorder import NullRecorder

CUDA = "run config key 'device': 'cuda' was asked for but torch sees no CUDA device"


def test_ranges_compress_partition_ids():
    assert ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert ranges([3]) == "3" and ranges([]) == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_names_the_key():
    with pytest.raises(ConfigError, match=CUDA):
        torch_device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_client_that_cannot_be_built_answers_the_preflight_with_the_reason():
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 3, "num-partitions": 10}, state=RecordDict(),
                      run_config={"device": "cuda", "num-threads": 1})  # fmt: skip
    answer = client_fn(context).get_properties({})  # its answer to the preflight's query
    assert answer["partition-id"] == 3 and answer["preflight-error"].startswith(CUDA)
    assert "Traceback" in answer["preflight-detail"]


@pytest.mark.parametrize(("run_config", "reason"), [
    ({"images-per-class": 400}, "the training pool holds 250 images of class 0 but the split needs 1000"),
    # the second half of 4 clients hold 4 + 8 images; by default such a client trains on them all
    ({"perfedavg-outer-batch-size": 40, "strict-batches": True}, "perfedavg-outer-batch-size 40 must be in [1, 12]"),
])  # fmt: skip
def test_a_client_whose_data_cannot_serve_the_run_answers_the_preflight_with_the_reason(run_config, reason):
    # through flwr run, such answers end the run as failed before round 1: tests/test_failures_e2e.py
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 3, "num-partitions": 4}, state=RecordDict(),
                      run_config=run_config)  # fmt: skip
    answer = client_fn(context).get_properties({})  # its answer to the preflight's query
    assert answer["partition-id"] == 3 and answer["preflight-error"].startswith(reason)


class AnsweringNode(FakeNode):
    """A node whose client reports a problem as data, the way clients/unavailable.py does."""

    def __init__(self, cid, partition, error):
        super().__init__(cid, partition)
        self.error = error

    def get_properties(self, config):
        properties = {**super().get_properties(config), "num-partitions": 12}
        if self.error:
            properties |= {"preflight-error": self.error, "preflight-detail": f"Traceback ...\n{self.error}"}
        return properties


def test_a_failed_preflight_condenses_causes_keeps_tracebacks_and_ends_the_run_as_failed():
    recorder = NullRecorder()
    strategy = FederatedStrategy(settings=settings(strategy="fedavg", num_server_rounds=3), recorder=recorder,
                      initial_model=[np.zeros((2, 2), np.float32)])  # fmt: skip
    nodes = []
    for partition in range(12):
        bad = "LEAF file /d/train/a.json is not valid JSON" if partition in (4, 9) else CUDA
        nodes.append(AnsweringNode(str(NODE_BASE + partition), partition, "" if partition == 11 else bad))
    # the nodes answer the preflight's query messages in this process, through Flower's encoding
    grid = InProcessGrid(run_config={}, num_clients=12,
                         client_app=serving(lambda context: nodes[int(context.node_config["partition-id"])]))
    with pytest.raises(RuntimeError) as raised:
        Rounds(method=strategy).start(grid=grid)  # the round engine plays the run, as the ServerApp does
    message = str(raised.value)
    assert f"9 of 12 clients (partitions 0-3, 5-8, 10): {CUDA}" in message
    assert "2 of 12 clients (partitions 4, 9): LEAF file /d/train/a.json is not valid JSON" in message
    log = recorder.texts["preflight-errors.log"]
    assert log.count("=====") == 11 and "Traceback" in log
    assert recorder.summary["status"] == "failed" and CUDA in recorder.summary["reason"]
    assert recorder.rounds == []


def test_a_truncated_leaf_file_is_named(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        blob = {"users": ["w"], "num_samples": [1], "user_data": {"w": {"x": [[0.0] * 784], "y": [1]}}}
        (tmp_path / split / "a.json").write_text(json.dumps(blob))
    truncated = tmp_path / "train" / "a.json"
    truncated.write_text(truncated.read_text()[:87])
    with pytest.raises(DataUnavailableError, match=rf"LEAF file {truncated} is not valid JSON .* is it truncated"):
        load_femnist(tmp_path)


def diffusion_config(**extra):
    return {"strategy": "diffusion", "dataset": "least-squares", "model": "linear", "partitioner": "natural",
            "diffusion-combination": "file", **extra}  # fmt: skip


def test_a_combination_file_is_checked_at_server_start_with_key_and_path(tmp_path):
    path = tmp_path / "A.txt"
    good = combination_matrix("metropolis", make_graph("ring", 5))
    bad = good.copy()
    bad[0, 0] += 0.1
    np.savetxt(path, bad)
    run = parse_settings(diffusion_config(**{"diffusion-combination-file": str(path)}))  # nodes parse it too
    with pytest.raises(ConfigError, match=rf"^diffusion-combination-file {path}: combination matrix column 0 sums to"):
        check_on_server(run)
    np.savetxt(path, good)
    check_on_server(run)
    three = diffusion_config(**{"diffusion-combination-file": str(path), "diffusion-participation-per-agent": "1,1,1"})
    with pytest.raises(ConfigError, match=r"disagree on the number of agents: diffusion-combination-file 5, "
                                          r"diffusion-participation-per-agent 3"):  # fmt: skip
        check_on_server(parse_settings(three))
    path.write_text("0.5 0.5\nnot numbers\n")
    with pytest.raises(ConfigError, match=rf"diffusion-combination-file {path}: not a matrix of numbers"):
        check_on_server(run)


def test_keys_the_strategy_never_reads_are_named_when_set_away_from_their_default():
    config = {"strategy": "perfedavg", "diffusion-participation-per-agent": "0.5,0.5", "lr": 0.1,
              "emnist-split": "digits", "fedprox-mu": 0.01, "batch-size": 20, "images-per-class": 4}  # fmt: skip
    ignored = ignored_keys(config, parse_settings(config))
    assert set(ignored) == {"diffusion-participation-per-agent", "lr", "emnist-split"}  # fedprox-mu is its default
    assert "a diffusion key; strategy is 'perfedavg'" in ignored["diffusion-participation-per-agent"]
    assert ignored_keys({"strategy": "fedavg", "lr": 0.1}, parse_settings({"strategy": "fedavg", "lr": 0.1})) == {}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"num-server-rounds": 10**30}, "'num-server-rounds': 1000000000000000000000000000000 is outside [1, 1000000]"),
        ({"local-steps": 10**7}, "'local-steps': 10000000 is outside [1, 1000000]"),
        ({"batch-size": 10**9}, "'batch-size': 1000000000 is outside [1, 1000000]"),
        ({"seed": "x"}, "'seed': 'x' is not an integer"),
        ({"seed": -1}, "'seed': -1 is outside [0, 9223372036854775807]"),
    ],
)
def test_absurd_values_and_wrong_types_read_well(config, expected):
    with pytest.raises(ConfigError) as raised:
        parse_settings(config)
    assert expected in str(raised.value)


def check_cli(text):
    return subprocess.run([sys.executable, "-m", "app.config", text], cwd=REPO, capture_output=True, text=True)


def test_a_run_config_string_can_be_checked_before_flwr_run_refuses_it():
    typo = check_cli("lrr=0.1 strategy='fedavg'")
    assert typo.returncode == 1
    assert typo.stdout.strip().splitlines() == [
        "error: unknown run config key(s) 'lrr' (did you mean 'lr'?) (every key: docs/configuration.md)"
    ]
    unused = check_cli("strategy='perfedavg' diffusion-participation-per-agent='0.5,0.5'")
    assert unused.returncode == 0
    lines = unused.stdout.strip().splitlines()
    assert lines[0].startswith("warning:") and "'diffusion-participation-per-agent' (a diffusion key" in lines[0]
    assert lines[1] == "ok: strategy 'perfedavg' on 'mnist-5k' accepts this run config"
