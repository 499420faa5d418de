"""``examples/message-app``: Flower's PyTorch template shape with a stamen strategy, run from a copy outside the clone.

The app imports the installed ``stamen`` (CI installs it with the test extras), as an
app made by ``flwr new`` would; its ServerApp is the template's ``@app.main()`` with
``stamen.PerFedAvg(...)`` where the template builds ``FedAvg(...)``.
"""

from __future__ import annotations

import json

import pytest
from helpers import example_copy

from app.local.simulation import LocalSimulation
from tests.conftest import shared_dataset


@pytest.mark.e2e
def test_the_template_shaped_app_runs_perfedavg_and_its_summary_names_the_apps_model(tmp_path):
    data_dir = shared_dataset("cifar10-jpeg")
    copy = example_copy("message-app", tmp_path, public_name="PerFedAvg")
    config = {"num-server-rounds": 2, "data-dir": str(data_dir), "max-per-class": 20, "fraction-train": 1.0,
              "results-dir": str(tmp_path / "results"), "run-name": "template"}  # fmt: skip
    with LocalSimulation(app_dir=copy, workdir=tmp_path) as sim:
        outcome = sim.run(run_config=config, num_supernodes=4, timeout_s=600)
    assert outcome.ok, outcome.log_tail
    assert "[round 1/2]" in outcome.log and "[round 2/2]" in outcome.log, outcome.log_tail
    summary = json.loads((tmp_path / "results" / "template" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["settings"]["strategy"] == "perfedavg"
    assert summary["settings"]["model"] == "Net" and summary["settings"]["app"]["data"] == "imagefolder-iid"
    assert summary["final"]["eval-clients"] == 4
    assert "Saving final model to disk" in outcome.log  # the template's last step ran on the Result start returned
