"""A real deployment whose SuperNodes bring their own image folders (``--node-config "data-dir=..."``).

A SuperLink and four SuperNodes on 127.0.0.1: three hold PNG folders of their own
(device 2 lacks two classes), the fourth a folder with an unreadable image. Per-FedAvg
runs 2 rounds to ``finished:completed`` without the fourth node, and ``summary.json``
reports what each node holds, by class name: had a node numbered its folders in
their sorted order, device 2 would report ``seven`` (its eighth folder is ``zero``).
The SuperNodes are warm devices: their 13 messages (4 preflight answers, 6 fits, 3
evaluations) each fork a process that has torch imported, instead of starting a
``flwr-clientapp`` (about 5 CPU-s each here); ``tests/test_warm_device.py`` shows that a
warm device gives the cold path's results on the same folders.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import REPO

from app.local.deployment import CONNECTION, LocalDeployment
from app.local.simulation import FINISHED_OK
from datasets.tools.device_folders import CLASSES, DIGITS, INPUT_SHAPE, make_device_folders

pytestmark = pytest.mark.e2e
RUN_TIMEOUT_S = 400


def held(folder):
    """``{class: images}`` in ``folder`` (one of a device's splits), counted from the files."""
    return {c.name: len(list(c.glob("*.png"))) for c in sorted(folder.iterdir()) if any(c.glob("*.png"))}


def test_supernodes_train_on_their_own_folders_and_a_faulty_one_is_left_out(tmp_path):
    devices = make_device_folders(tmp_path / "devices", devices=3, train_per_class=6, test_per_class=3,
                                  drop={2: ("seven", "nine")})  # fmt: skip
    faulty = tmp_path / "devices" / "device-3"
    shutil.copytree(devices[0], faulty)
    (faulty / "train" / "four" / "broken.png").write_bytes(b"\x89PNG truncated")
    results = tmp_path / "results"
    config = {"strategy": "perfedavg", "dataset": "imagefolder", "classes": CLASSES, "input-shape": INPUT_SHAPE,
              "num-server-rounds": 2, "fraction-fit": 1.0, "eval-every": 2, "min-available-clients": 4,
              "results-dir": str(results), "run-name": "own-data"}  # fmt: skip
    with LocalDeployment(app_dir=REPO, num_nodes=4, node_data=[*devices, faulty], warm=True,
                         workdir=tmp_path / "deployment") as deployment:  # fmt: skip
        outcome = deployment.run(config, timeout_s=RUN_TIMEOUT_S)
        log = "" if outcome.status == FINISHED_OK else subprocess.run(
            ["flwr", "log", outcome.run_id, CONNECTION, "--show"], env=deployment.env, cwd=deployment.workdir,
            capture_output=True, text=True, timeout=60).stdout[-4000:] + "\n" + deployment.report()  # fmt: skip
    assert outcome.status == FINISHED_OK, log
    summary = json.loads((results / "own-data" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 2
    # the devices are numbered 0-2 (by Flower node id, not by a string they send); the faulty one is out
    by_folder = {node["data-dir"]: node for node in summary["nodes"]}
    assert sorted(by_folder) == sorted(str(d.resolve()) for d in devices)
    assert [node["partition"] for node in summary["nodes"]] == [0, 1, 2]
    (reason,) = summary["nodes-left-out"].values()
    assert str((faulty / "train" / "four" / "broken.png").resolve()) in reason
    for folder in devices:
        node = by_folder[str(folder.resolve())]
        assert node["train-classes"] == held(folder / "train") and node["test-classes"] == held(folder / "test")
        assert node["num-train"] == sum(held(folder / "train").values())
    assert set(by_folder[str(devices[2].resolve())]["train-classes"]) == set(DIGITS) - {"seven", "nine"}
    records = [json.loads(line) for line in (results / "own-data" / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients-succeeded"] for r in records] == [3, 3] and records[-1]["eval-clients"] == 3
    assert sorted(records[0]["fit-partitions"]) == [0, 1, 2]
